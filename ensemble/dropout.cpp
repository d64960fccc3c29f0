// Dropout (layers.h): LayerOps::dropout with the runner's keys, step and global example offset; the same op
// on the output gradient is the backward. In place.
#include <pmap/error.h>

#include <cstdio>
#include <utility>

#include <pmapcc/ensemble/layers.h>

namespace pmap::ensemble {
namespace {

class Dropout final : public Layer {
 public:
  Dropout(std::string name, float rate) : name_(std::move(name)), rate_(rate) {
    if (!(rate >= 0 && rate < 1))
      throw ValueError(name_ + ": Dropout's rate must be in [0, 1), got " + std::to_string(rate));
  }
  std::string name() const override { return name_; }
  std::string kind() const override { return "Dropout"; }
  std::string describe() const override {
    char buf[48];
    std::snprintf(buf, sizeof buf, "Dropout(%g)", static_cast<double>(rate_));
    return buf;
  }
  std::unique_ptr<Layer> clone() const override { return std::make_unique<Dropout>(*this); }
  Dims output_shape(const Dims& in) const override { return in; }
  std::vector<ParamSpec> params(const Dims&) const override { return {}; }
  bool random() const override { return true; }
  // Flat features split in blocks over devices: each device masks its block with the whole layer's feature
  // indices (LayerCall::block), so a model-parallel run draws the same masks.
  bool keeps_feature_blocks(const Dims& in) const override { return in.size() == 1; }
  bool in_place() const override { return true; }
  std::size_t workspace_bytes(const kernels::Backend&, const LayerCall&) const override { return 0; }
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float* x, float* y,
               void*) const override {
    if (c.training()) {
      be.layers().dropout(kparams(c), c.context->keys, c.context->step, x, y);
    } else if (x != y) {
      be.copy(y, x, count(c) * sizeof(float));
    }
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float*, const float*,
                const float* dy, float* dx, float* const*, void*) const override {
    if (dx == nullptr) return;
    if (!c.training()) throw Error(name_ + ": backward needs a training forward");
    be.layers().dropout(kparams(c), c.context->keys, c.context->step, dy, dx);
  }

 private:
  static std::size_t count(const LayerCall& c) {
    return static_cast<std::size_t>(c.members) * static_cast<std::size_t>(c.batch) *
           static_cast<std::size_t>(product(c.input));
  }
  kernels::DropoutParams kparams(const LayerCall& c) const {
    if (c.shared_input) throw ShapeError(name_ + ": Dropout cannot read the shared input batch");
    kernels::DropoutParams k;
    k.members = c.members, k.rows = c.batch, k.features = product(c.input), k.rate = rate_;
    k.example_offset = c.context->example_offset, k.stream = c.stream;
    k.feature_offset = std::int64_t{c.block} * k.features;
    k.rates = c.context->dropout_rates;  // a hyper-parameter ensemble's rates, when it has them
    return k;
  }
  std::string name_;
  float rate_;
};

}  // namespace

std::unique_ptr<Layer> dropout(std::string name, float rate) {
  return std::make_unique<Dropout>(std::move(name), rate);
}

}  // namespace pmap::ensemble
