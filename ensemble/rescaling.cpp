// Rescaling (layers.h): LayerOps::scale_shift. A shared input gives a shared output, so it may come first.
#include <pmap/error.h>

#include <cmath>
#include <cstdio>

#include <pmapcc/ensemble/layers.h>

namespace pmap::ensemble {
namespace {

class Rescaling final : public Layer {
 public:
  Rescaling(float scale, float offset) : scale_(scale), offset_(offset) {
    if (!std::isfinite(scale) || !std::isfinite(offset)) throw ValueError("rescaling: scale and offset must be finite");
  }
  std::string name() const override { return "rescaling"; }
  std::string kind() const override { return "Rescaling"; }
  std::string describe() const override {
    char buf[64];
    std::snprintf(buf, sizeof buf, "Rescaling(%g, %g)", static_cast<double>(scale_), static_cast<double>(offset_));
    return buf;
  }
  std::unique_ptr<Layer> clone() const override { return std::make_unique<Rescaling>(*this); }
  bool keeps_feature_blocks(const Dims&) const override { return true; }
  bool keeps_shared() const override { return true; }
  Dims output_shape(const Dims& in) const override { return in; }
  std::vector<ParamSpec> params(const Dims&) const override { return {}; }
  bool in_place() const override { return true; }
  std::size_t workspace_bytes(const kernels::Backend&, const LayerCall&) const override { return 0; }
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float* x, float* y,
               void*) const override {
    be.layers().scale_shift(count(c), x, scale_, offset_, y);
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float*, const float*,
                const float* dy, float* dx, float* const*, void*) const override {
    if (dx != nullptr) be.layers().scale_shift(count(c), dy, scale_, 0.0f, dx);
  }

 private:
  static std::size_t count(const LayerCall& c) {
    return static_cast<std::size_t>((c.shared_input ? 1 : c.members) * c.batch * product(c.input));
  }
  float scale_;
  float offset_;
};

}  // namespace

std::unique_ptr<Layer> rescaling(float scale, float offset) { return std::make_unique<Rescaling>(scale, offset); }

}  // namespace pmap::ensemble
