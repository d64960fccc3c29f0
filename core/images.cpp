// The image primitives of pmap::ops (pmapcc/core/ops.h): convolution and average pooling, evaluated by the
// kernels' ConvOps through pmap::ops::eager; their VJPs are the kernels' backward ops.
#include <pmapcc/core/ops.h>

#include <memory>
#include <string>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/core/primitive.h>

namespace pmap::ops {
namespace {

using core::Arrays;

class Conv2d final : public core::Primitive {
 public:
  Conv2d(Conv2dOptions o, bool bias) : o_(o), bias_(bias) {}
  std::string name() const override { return o_.relu ? "conv2d(relu)" : "conv2d"; }
  std::vector<Array> eval(Arrays in) const override {
    const Array none;
    std::vector<Array> out;
    out.push_back(eager::conv2d(*in[0], *in[1], bias_ ? *in[2] : none, o_));
    return out;
  }
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    Array masked;  // the pre-activation's cotangent
    if (o_.relu) masked = eager::relu_grad(*out[0], *cts[0]);
    const Array& dy = o_.relu ? masked : *cts[0];
    auto g = eager::conv2d_backward(*in[0], *in[1], dy, o_, w[0], w[1], bias_ && w[2]);
    std::vector<Array> grads;
    grads.push_back(std::move(g.dx));
    grads.push_back(std::move(g.dw));
    if (bias_) grads.push_back(std::move(g.dbias));
    return grads;
  }

 private:
  Conv2dOptions o_;
  bool bias_;
};

class AvgPool final : public core::Primitive {
 public:
  AvgPool(int wh, int ww, int sh, int sw) : wh_(wh), ww_(ww), sh_(sh), sw_(sw) {}
  std::string name() const override { return "avg_pool"; }
  std::vector<Array> eval(Arrays in) const override {
    std::vector<Array> out;
    out.push_back(eager::avg_pool(*in[0], wh_, ww_, sh_, sw_));
    return out;
  }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (w[0]) g[0] = eager::avg_pool_backward(*cts[0], in[0]->shape(), wh_, ww_, sh_, sw_);
    return g;
  }

 private:
  int wh_, ww_, sh_, sw_;
};

}  // namespace

Array conv2d(const Array& x, const Array& w, const Array& bias, Conv2dOptions options) {
  if (bias.valid()) return core::apply1(std::make_shared<Conv2d>(options, true), {&x, &w, &bias});
  return core::apply1(std::make_shared<Conv2d>(options, false), {&x, &w});
}

Array avg_pool(const Array& x, int window_h, int window_w, int stride_h, int stride_w) {
  return core::apply1(std::make_shared<AvgPool>(window_h, window_w, stride_h, stride_w), {&x});
}

Array global_avg_pool(const Array& x) {
  if (x.ndim() != 4) throw ShapeError("ops::global_avg_pool: x " + x.signature() + " must be (N, H, W, C)");
  const int h = static_cast<int>(x.dim(1)), w = static_cast<int>(x.dim(2));
  return reshape(avg_pool(x, h, w, h, w), {x.dim(0), x.dim(3)});
}

}  // namespace pmap::ops
