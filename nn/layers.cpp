// Dense and Conv (nn/layers.h).
#include <pmapcc/nn/layers.h>

#include <string>

#include <pmap/error.h>

#include <pmapcc/nn/init.h>
#include <pmapcc/nn/summary.h>

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
  Array y = ops::linear(x, p.kernel, p.bias, relu);
  if (recording_modules())
    record_module_call("Dense", std::to_string(features) + (relu ? ", relu" : ""), {&p.kernel, &p.bias}, y);
  return y;
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
  Array y = ops::conv2d(x, p.kernel, p.bias, {.stride_h = stride_h, .stride_w = stride_w, .same = same, .relu = relu});
  if (recording_modules()) record_module_call("Conv2D", settings(true, relu), {&p.kernel, &p.bias}, y);
  return y;
}

Array Conv::operator()(const ConvKernel& p, const Array& x, bool relu) const {
  Array y = ops::conv2d(x, p.kernel, Array(), {.stride_h = stride_h, .stride_w = stride_w, .same = same, .relu = relu});
  if (recording_modules()) record_module_call("Conv2D", settings(false, relu), {&p.kernel}, y);
  return y;
}

// "32, 3x3", then ", stride 2" (or "2x1"), ", valid", ", no bias", ", relu" where they apply.
std::string Conv::settings(bool bias, bool relu) const {
  std::string s = std::to_string(features) + ", " + std::to_string(kernel_h) + "x" + std::to_string(kernel_w);
  if (stride_h != 1 || stride_w != 1)
    s += ", stride " + (stride_h == stride_w ? std::to_string(stride_h)
                                             : std::to_string(stride_h) + "x" + std::to_string(stride_w));
  if (!same) s += ", valid";
  if (!bias) s += ", no bias";
  if (relu) s += ", relu";
  return s;
}

}  // namespace pmap::nn
