// The image primitives of pmap::ops (pmapcc/core/ops.h): convolution and average pooling, evaluated by the
// kernels' ConvOps through pmap::ops::eager; their VJPs are the kernels' backward ops.
#include <pmapcc/core/ops.h>

#include <memory>
#include <string>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/primitive.h>

namespace pmap::ops {
namespace {

using core::Arrays;

class Conv2d final : public core::Primitive {
 public:
  Conv2d(Conv2dOptions o, bool bias, bool premasked = false,
         kernels::Precision precision = eager::default_precision())
      : o_(o), bias_(bias), premasked_(premasked), precision_(precision) {}
  std::string name() const override { return o_.relu ? "conv2d(relu)" : "conv2d"; }
  core::Attributes attributes() const override {
    return {{"stride_h", std::int64_t{o_.stride_h}}, {"stride_w", std::int64_t{o_.stride_w}},
            {"same", std::int64_t{o_.same}},         {"relu", std::int64_t{o_.relu}},
            {"bias", std::int64_t{bias_}},           {"precision", std::string(kernels::name(precision_))}};
  }
  bool output_is_relu() const override { return o_.relu; }
  std::shared_ptr<const Primitive> premasked() const override {
    return o_.relu ? std::make_shared<Conv2d>(o_, bias_, true, precision_) : nullptr;
  }
  std::vector<Array> eval(Arrays in) const override {
    eager::DefaultPrecision scope(precision_);
    const Array none;
    std::vector<Array> out;
    out.push_back(eager::conv2d(*in[0], *in[1], bias_ ? *in[2] : none, o_));
    return out;
  }
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    eager::DefaultPrecision scope(precision_);  // the forward's, wherever the backward pass runs
    Array masked;  // the pre-activation's cotangent (premasked: the cotangent already is)
    const bool mask = o_.relu && !premasked_;
    if (mask) masked = eager::relu_grad(*out[0], *cts[0]);
    const Array& dy = mask ? masked : *cts[0];
    auto g = eager::conv2d_backward(*in[0], *in[1], dy, o_, w[0], w[1], bias_ && w[2]);
    std::vector<Array> grads;
    grads.push_back(std::move(g.dx));
    grads.push_back(std::move(g.dw));
    if (bias_) grads.push_back(std::move(g.dbias));
    return grads;
  }
  // Stacked weights (and bias): the kernels' member count, x stacked or one x every member reads. Shared
  // weights: the members' images are more images. Otherwise member by member.
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    switch (form(in, batched)) {
      case Form::members: return eval(in);
      case Form::images: {
        Array x = core::merge_members(*in[0]);
        std::vector<const Array*> ptrs(in.begin(), in.end());
        ptrs[0] = &x;
        std::vector<Array> y = eval(ptrs);
        y[0] = core::split_members(std::move(y[0]), members);
        return y;
      }
      case Form::each: break;
    }
    return Primitive::batch(in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    switch (form(in, batched)) {
      case Form::members: return vjp(in, out, cts, wanted);
      case Form::images: {
        Array x = core::merge_members(*in[0]), y = core::merge_members(*out[0]), ct = core::merge_members(*cts[0]);
        std::vector<const Array*> ins(in.begin(), in.end());
        ins[0] = &x;
        const Array* o[] = {&y};
        const Array* c[] = {&ct};
        std::vector<Array> g = vjp(ins, o, c, wanted);
        if (g[0].valid()) g[0] = core::split_members(std::move(g[0]), members);
        return g;
      }
      case Form::each: break;
    }
    return Primitive::batch_vjp(in, out, cts, wanted, batched, members);
  }

 private:
  enum class Form { members, images, each };
  Form form(Arrays in, const std::vector<bool>& batched) const {
    const bool bias_batched = !bias_ || batched[2];
    if (batched[1] && bias_batched && in[0]->ndim() == (batched[0] ? 5 : 4)) return Form::members;
    if (batched[0] && !batched[1] && !(bias_ && batched[2]) && in[0]->ndim() == 5) return Form::images;
    return Form::each;
  }

  Conv2dOptions o_;
  bool bias_;
  bool premasked_;
  kernels::Precision precision_;  // the caller's at the call (ops::DefaultPrecision)
};

class AvgPool final : public core::Primitive {
 public:
  enum class Mask { none, masking, over_input };
  AvgPool(int wh, int ww, int sh, int sw, Mask mask = Mask::none) : wh_(wh), ww_(ww), sh_(sh), sw_(sw), mask_(mask) {}
  std::string name() const override { return "avg_pool"; }
  core::Attributes attributes() const override {
    return {{"window_h", std::int64_t{wh_}}, {"window_w", std::int64_t{ww_}}, {"stride_h", std::int64_t{sh_}},
            {"stride_w", std::int64_t{sw_}}};
  }
  std::shared_ptr<const Primitive> masking_input(bool over_input) const override {
    return std::make_shared<AvgPool>(wh_, ww_, sh_, sw_, over_input ? Mask::over_input : Mask::masking);
  }
  std::vector<Array> eval(Arrays in) const override {
    std::vector<Array> out;
    out.push_back(eager::avg_pool(*in[0], wh_, ww_, sh_, sw_));
    return out;
  }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (w[0] && mask_ == Mask::over_input) {  // ... written over x, which the backward pass has spent
      g[0] = eager::avg_pool_relu_backward_over(core::plain_view(*in[0]), *cts[0], wh_, ww_, sh_, sw_);
    } else if (w[0] && mask_ == Mask::masking) {  // x = relu(...): dx where x > 0, in the same pass
      g[0] = eager::avg_pool_relu_backward(*in[0], *cts[0], wh_, ww_, sh_, sw_);
    } else if (w[0]) {
      g[0] = eager::avg_pool_backward(*cts[0], in[0]->shape(), wh_, ww_, sh_, sw_);
    }
    return g;
  }
  // The members' images are more images.
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    return core::batch_images(*this, in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    return core::batch_images_vjp(*this, in, out, cts, wanted, batched, members);
  }

 private:
  int wh_, ww_, sh_, sw_;
  Mask mask_;
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
