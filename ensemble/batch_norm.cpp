// BatchNormalization (layers.h): LayerOps's four steps around the psum of the batch's sums, which LayerContext
// provides in data- and model-parallel runs, so the statistics are those of the global batch.
#include <pmap/error.h>

#include <cmath>
#include <cstdio>
#include <utility>

#include <pmapcc/ensemble/layers.h>

namespace pmap::ensemble {
namespace {

class BatchNormalization final : public Layer {
 public:
  BatchNormalization(std::string name, BatchNormOptions o) : name_(std::move(name)), o_(o) {
    if (!(o.epsilon > 0) || !std::isfinite(o.epsilon) || !(o.momentum >= 0 && o.momentum <= 1))
      throw ValueError(name_ + ": BatchNormalization needs epsilon > 0 and momentum in [0, 1]");
  }
  std::string name() const override { return name_; }
  std::string kind() const override { return "BatchNormalization"; }
  std::string describe() const override {
    char buf[96];
    std::snprintf(buf, sizeof buf, "BatchNormalization(momentum %g, epsilon %g%s%s)", static_cast<double>(o_.momentum),
                  static_cast<double>(o_.epsilon), o_.center ? "" : ", no center", o_.scale ? "" : ", no scale");
    return buf;
  }
  std::unique_ptr<Layer> clone() const override { return std::make_unique<BatchNormalization>(*this); }
  Dims output_shape(const Dims& in) const override {
    if (in.empty()) throw ShapeError(name_ + ": expects (..., C) inputs");
    return in;
  }
  std::vector<ParamSpec> params(const Dims& in) const override {
    std::vector<ParamSpec> p;
    if (o_.scale) p.push_back({"gamma", {in.back()}, 0, false, 0, Init::ones});
    if (o_.center) p.push_back({"beta", {in.back()}, 0, false, 0, Init::zeros});
    return p;
  }
  std::vector<ParamSpec> state(const Dims& in) const override {
    return {{"moving_mean", {in.back()}, 0, false, 0, Init::zeros},
            {"moving_variance", {in.back()}, 0, false, 0, Init::ones}};
  }
  // The batch's sums (M, 2, C) f64, the statistics (M, 2, C) f32, the output gradient's sums (M, 2, C) f64.
  std::vector<BufferSpec> buffers(const LayerCall& c) const override {
    const std::int64_t n = std::int64_t{c.members} * 2 * c.input.back();
    return {{n, DType::f64}, {n, DType::f32}, {n, DType::f64}};
  }
  bool syncs_batch() const override { return true; }
  bool in_place() const override { return false; }  // the backward reads x
  bool fuses_relu_forward() const override { return true; }
  std::size_t workspace_bytes(const kernels::Backend&, const LayerCall&) const override { return 0; }

  void forward(const kernels::Backend& be, const LayerCall& c, const float* const* p, const float* x, float* y,
               void*) const override {
    const kernels::BatchNormParams k = kparams(c);
    const kernels::LayerOps& ops = be.layers();
    Array& sums = c.buffers[0];
    float* stats = c.buffers[1].data<float>();
    if (c.training()) {
      ops.batch_norm_sums(k, x, sums.data<double>());
      if (c.context->batch_sum) c.context->batch_sum(sums);
      ops.batch_norm_statistics(k, sums.data<double>(), count(c), c.state[0], c.state[1], stats);
    } else {
      ops.batch_norm_statistics(k, nullptr, 0.0, c.state[0], c.state[1], stats);
    }
    ops.batch_norm_apply(k, x, stats, gamma(p), beta(p), y);
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const* p, const float* x, const float*,
                const float* dy, float* dx, float* const* dp, void*) const override {
    if (!c.training()) throw Error(name_ + ": backward needs a training forward");
    const kernels::BatchNormParams k = kparams(c);
    const kernels::LayerOps& ops = be.layers();
    const float* stats = c.buffers[1].data<float>();
    Array& sums = c.buffers[2];
    float* dgamma = o_.scale ? dp[0] : nullptr;
    float* dbeta = o_.center ? dp[o_.scale ? 1 : 0] : nullptr;
    ops.batch_norm_backward_sums(k, x, dy, stats, sums.data<double>(), dgamma, dbeta);
    if (dx == nullptr) return;
    if (c.context->batch_sum) c.context->batch_sum(sums);
    ops.batch_norm_backward(k, x, dy, stats, sums.data<double>(), count(c), gamma(p), dx);
  }

 private:
  const float* gamma(const float* const* p) const { return o_.scale ? p[0] : nullptr; }
  const float* beta(const float* const* p) const { return o_.center ? p[o_.scale ? 1 : 0] : nullptr; }
  // The rows of the global batch each channel's statistics are over.
  static double count(const LayerCall& c) {
    return static_cast<double>(c.batch) * static_cast<double>(product(c.input) / c.input.back()) *
           static_cast<double>(c.context->batch_devices);
  }
  kernels::BatchNormParams kparams(const LayerCall& c) const {
    if (c.shared_input) throw ShapeError(name_ + ": BatchNormalization cannot read the shared input batch");
    if (c.state == nullptr || c.buffers == nullptr) throw Error(name_ + ": called without its state and buffers");
    kernels::BatchNormParams k;
    k.members = c.members, k.channels = static_cast<int>(c.input.back());
    k.rows = std::int64_t{c.batch} * (product(c.input) / c.input.back());
    k.epsilon = o_.epsilon, k.momentum = o_.momentum, k.relu = c.relu;
    return k;
  }
  std::string name_;
  BatchNormOptions o_;
};

}  // namespace

std::unique_ptr<Layer> batch_norm(std::string name, BatchNormOptions options) {
  return std::make_unique<BatchNormalization>(std::move(name), options);
}

}  // namespace pmap::ensemble
