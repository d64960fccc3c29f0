// Dense and Conv (nn/layers.h).
#include <pmapcc/nn/layers.h>

#include <string>

#include <pmap/error.h>

#include <pmapcc/nn/init.h>

namespace pmap::nn {
namespace {

Array kernel(Init init, Key key, const Shape& shape, std::int64_t fan_in, std::int64_t fan_out, const Device& d) {
  return init == Init::lecun_normal ? lecun_normal(key, shape, fan_in, d) : glorot_uniform(key, shape, fan_in, fan_out, d);
}

void check_positive(const char* module, const char* what, std::int64_t v) {
  if (v <= 0) throw ValueError(std::string("nn::") + module + ": " + what + " must be positive, got " + std::to_string(v));
}

}  // namespace

DenseParams Dense::init(Key key, std::int64_t in, const Device& device) const {
  check_positive("Dense", "features", features);
  check_positive("Dense", "the input features", in);
  return {kernel(kernel_init, key, {in, features}, in, features, device), zeros({features}, device)};
}

Array Dense::operator()(const DenseParams& p, const Array& x, bool relu) const {
  return ops::linear(x, p.kernel, p.bias, relu);
}

ConvKernel Conv::init_kernel(Key key, std::int64_t in_channels, const Device& device) const {
  check_positive("Conv", "features", features);
  check_positive("Conv", "the input channels", in_channels);
  check_positive("Conv", "the kernel height", kernel_h);
  check_positive("Conv", "the kernel width", kernel_w);
  const std::int64_t area = std::int64_t{kernel_h} * kernel_w;
  return {kernel(kernel_init, key, {kernel_h, kernel_w, in_channels, features}, area * in_channels, area * features,
                 device)};
}

ConvParams Conv::init(Key key, std::int64_t in_channels, const Device& device) const {
  return {init_kernel(key, in_channels, device).kernel, zeros({features}, device)};
}

Array Conv::operator()(const ConvParams& p, const Array& x, bool relu) const {
  return ops::conv2d(x, p.kernel, p.bias, {.stride_h = stride_h, .stride_w = stride_w, .same = same, .relu = relu});
}

Array Conv::operator()(const ConvKernel& p, const Array& x, bool relu) const {
  return ops::conv2d(x, p.kernel, Array(), {.stride_h = stride_h, .stride_w = stride_w, .same = same, .relu = relu});
}

}  // namespace pmap::nn
