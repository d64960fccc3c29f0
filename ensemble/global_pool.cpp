// GlobalAveragePooling2D (Keras): each channel's mean over the image, (H, W, C) -> (C). It is an average
// pool whose window is the whole image, so it runs on the avg_pool ops: (M, N, 1, 1, C) is (M, N, C) in memory.
#include <pmapcc/ensemble/layers.h>

#include <pmap/array.h>
#include <pmap/error.h>

namespace pmap::ensemble {
namespace {

class GlobalAvgPool final : public Layer {
 public:
  std::string name() const override { return "global_avg_pool"; }
  std::string kind() const override { return "GlobalAveragePooling2D"; }
  std::unique_ptr<Layer> clone() const override { return std::make_unique<GlobalAvgPool>(); }
  bool keeps_feature_blocks(const Dims& in) const override { return in.size() == 3; }  // per channel
  Dims output_shape(const Dims& in) const override {
    if (in.size() != 3) throw ShapeError("global_avg_pool: expects (H, W, C) inputs, got " + shape_str(in));
    return {in[2]};
  }
  std::vector<ParamSpec> params(const Dims&) const override { return {}; }
  bool in_place() const override { return false; }
  std::size_t workspace_bytes(const kernels::Backend&, const LayerCall&) const override { return 0; }
  void forward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float* x, float* y,
               void*) const override {
    be.avg_pool_forward(kparams(c), x, y);
  }
  void backward(const kernels::Backend& be, const LayerCall& c, const float* const*, const float*, const float*,
                const float* dy, float* dx, float* const*, void*) const override {
    if (dx != nullptr) be.avg_pool_backward(kparams(c), dy, dx);
  }
  bool fuses_relu_backward() const override { return true; }
  void backward_through_relu(const kernels::Backend& be, const LayerCall& c, const float* r, const float* dy,
                             float* dx) const override {
    be.avg_pool_relu_backward(kparams(c), r, dy, dx);
  }

 private:
  static kernels::AvgPoolParams kparams(const LayerCall& c) {
    if (c.shared_input) throw ShapeError("global_avg_pool: cannot be a model's first layer");
    kernels::AvgPoolParams p;
    p.members = c.members, p.batch = c.batch;
    p.height = p.window_h = p.stride_h = static_cast<int>(c.input[0]);
    p.width = p.window_w = p.stride_w = static_cast<int>(c.input[1]);
    p.channels = static_cast<int>(c.input[2]);
    return p;
  }
};

}  // namespace

std::unique_ptr<Layer> global_avg_pool() { return std::make_unique<GlobalAvgPool>(); }

}  // namespace pmap::ensemble
