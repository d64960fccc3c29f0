// Layers with explicit forward and backward (no tape): Conv2D, Dense, ReLU, AvgPool, GlobalAveragePooling2D,
// Flatten, and for model parallelism GatherFeatures. A layer holds only its configuration; parameters live in the model's
// one contiguous buffer and are passed in.
// Every call runs `members` ensemble members at once on member-major tensors (see kernels/ops.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <pmapcc/kernels/backend.h>

namespace pmap::ensemble {

using Dims = std::vector<std::int64_t>;  // per-example shape: (H, W, C) or (F)

// One parameter tensor of a layer, per member.
struct ParamSpec {
  std::string name;       // "kernel" or "bias", as in Flax
  Dims shape;             // per member, e.g. (3, 3, 1, 32)
  std::int64_t fan_in;    // for LeCun-normal init
  bool is_bias;           // biases start at zero
};

// The sizes of one call: M members, N examples each, per-example input shape.
struct LayerCall {
  int members = 1;
  int batch = 1;
  Dims input;
  bool shared_input = false;  // the input is one (N, ...) tensor read by every member
  bool relu = false;          // forward: apply the following ReLU to the output (fuses_relu_forward())
  int block = 0;              // gather_features: this device's block of the features (its model axis index)
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string name() const = 0;              // "Conv_0", "Dense_1", ...: the checkpoint names
  virtual std::string kind() const = 0;              // Keras's class name: "Conv2D", "Dense", "ReLU", ...
  // The kind and the settings that change what it computes, e.g. "Conv2D(32, 3x3, stride 2, valid, no bias)":
  // what Sequential::summary() and architecture() print. The default: kind().
  virtual std::string describe() const { return kind(); }
  virtual Dims output_shape(const Dims& input) const = 0;
  virtual std::vector<ParamSpec> params(const Dims& input) const = 0;
  virtual bool in_place() const = 0;                 // the output may be written over the input
  virtual std::size_t workspace_bytes(const kernels::Backend& be, const LayerCall& c) const = 0;
  // y (M, N, *out) from x; params[i] points at the i-th ParamSpec's (M, *shape) block.
  virtual void forward(const kernels::Backend& be, const LayerCall& c, const float* const* params, const float* x,
                       float* y, void* ws) const = 0;
  // dx (nullptr: not needed) and dparams[i] (written) from dy; x and y as in (after) the forward.
  virtual void backward(const kernels::Backend& be, const LayerCall& c, const float* const* params, const float* x,
                        const float* y, const float* dy, float* dx, float* const* dparams, void* ws) const = 0;

  // Fusion with a neighbouring ReLU, which ModelRunner uses where the backend has Backend::fused_relu().
  virtual bool is_relu() const { return false; }
  // forward() applies max(., 0) to its output when LayerCall::relu is set (Conv2D, Dense).
  virtual bool fuses_relu_forward() const { return false; }
  // backward_through_relu(): for a parameterless layer whose input r is a ReLU's output, dx = backward's dx
  // where r > 0, else 0, in one pass; dx may be r (AvgPool). The default throws.
  virtual bool fuses_relu_backward() const { return false; }
  virtual void backward_through_relu(const kernels::Backend& be, const LayerCall& c, const float* r, const float* dy,
                                     float* dx) const;

  // Model parallelism (ensemble/layout.h). A copy of the layer; with_features(n): a copy with n output
  // features (Conv2D, Dense: the layer as one device runs it when its outputs are split; others throw).
  virtual std::unique_ptr<Layer> clone() const = 0;
  virtual std::unique_ptr<Layer> with_features(int features) const;
  // Whether an input whose last dimension is split into contiguous blocks over devices gives an output
  // split the same way, each device computing its block from its own (ReLU, AvgPool; Flatten of a flat
  // input). A layer with parameters instead consumes such an input (row-parallel).
  virtual bool keeps_feature_blocks(const Dims& /*input*/) const { return false; }
};

// Conv2D's settings, as Keras's Conv2D: a square kernel, a stride in both directions, padding (same:
// out = ceil(in / stride), the odd padding pixel after, as TensorFlow/Keras and XLA; valid: none) and
// whether it has a bias.
struct Conv2dOptions {
  int kernel = 3;
  int stride = 1;
  kernels::Padding padding = kernels::Padding::same;
  bool use_bias = true;
};
std::unique_ptr<Layer> conv2d(std::string name, int features, int kernel = 3);  // SAME padding, stride 1
std::unique_ptr<Layer> conv2d(std::string name, int features, Conv2dOptions options);
std::unique_ptr<Layer> dense(std::string name, int features);
std::unique_ptr<Layer> relu();
std::unique_ptr<Layer> avg_pool(int window = 2);  // window = stride, VALID
std::unique_ptr<Layer> flatten();
// Keras's GlobalAveragePooling2D: (H, W, C) -> (C), each channel's mean.
std::unique_ptr<Layer> global_avg_pool();
// Model parallelism (ensemble/layout.h): the whole features from `parts` devices' contiguous blocks of the
// last dimension, (..., F) -> (..., parts x F). Its forward writes the input into block LayerCall::block of
// the output and leaves the other blocks as they are: the caller zeroes the output first, and a psum over
// the devices completes it (ModelRunner does both); its backward takes that block of the output gradient.
// The copies run row by row (Backend::copy): slow for many rows.
std::unique_ptr<Layer> gather_features(int parts);

std::int64_t product(const Dims& d);

}  // namespace pmap::ensemble
