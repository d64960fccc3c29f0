// Layers with explicit forward and backward (no tape): Conv2D, Dense, ReLU, AvgPool, GlobalAveragePooling2D,
// Flatten, BatchNormalization, Dropout, Rescaling, and for model parallelism GatherFeatures. A layer holds only
// its configuration; its variables (parameters, and model state such as BatchNorm's moving statistics) live
// in the model's buffers (model.h's TensorLayout) and are passed in.
// Every call runs `members` ensemble members at once on member-major tensors (see kernels/ops.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <pmap/array.h>

#include <pmapcc/kernels/backend.h>

namespace pmap::ensemble {

using Dims = std::vector<std::int64_t>;  // per-example shape: (H, W, C) or (F)

// How a variable starts (Sequential::init). automatic: zeros for a bias, else LeCun normal (Flax's default).
//   lecun_normal:   truncated normal in [-2, 2], stddev sqrt(1 / fan_in) / 0.8796256610342398 (Flax)
//   glorot_uniform: uniform in [-l, l], l = sqrt(6 / (fan_in + fan_out)) (Keras's default)
enum class Init { automatic, lecun_normal, glorot_uniform, zeros, ones };

// One variable tensor of a layer, per member: a parameter (params()) or model state (state()).
struct ParamSpec {
  std::string name;          // "kernel", "bias", "gamma", "moving_mean", ...: as in Flax and Keras
  Dims shape;                // per member, e.g. (3, 3, 1, 32)
  std::int64_t fan_in;       // for the initializers
  bool is_bias;              // a bias: starts at zero, and a row-parallel layer adds it on one device only
  std::int64_t fan_out = 0;  // glorot_uniform
  Init init = Init::automatic;
};

// What a call of a layer needs beyond shapes and variables, the same for every layer of one forward.
struct LayerContext {
  bool training = false;                  // batch statistics and dropout masks (else moving statistics, no dropout)
  const std::uint32_t* keys = nullptr;    // (members, 2) u32, device: the call's members' random keys (Dropout)
  const std::int64_t* step = nullptr;     // (1) i64, device: the step counter (Dropout)
  const float* dropout_rates = nullptr;   // (members) f32, device, nullable: each member's rate for every Dropout
  std::int64_t example_offset = 0;        // the global index of this device's first example in the step's batch
  int batch_devices = 1;                  // the devices the global batch is spread over, equal shares
  std::function<void(Array&)> batch_sum;  // sums an array over those devices (a psum); empty: one device
};

// The sizes of one call: M members, N examples each, per-example input shape.
struct LayerCall {
  int members = 1;
  int batch = 1;
  Dims input;
  bool shared_input = false;  // the input is one (N, ...) tensor read by every member
  bool relu = false;          // forward: apply the following ReLU to the output (fuses_relu_forward())
  int block = 0;              // gather_features: this device's block of the features (its model axis index)
  float* const* state = nullptr;          // state[i]: the i-th state() tensor's (M, *shape) block
  Array* buffers = nullptr;               // the layer's buffers() (ModelRunner keeps them between forward and backward)
  const LayerContext* context = nullptr;  // null: inference on one device
  std::uint32_t stream = 0;               // random(): which random layer of the model this is (0, 1, ...)
  kernels::Precision precision = kernels::Precision::fp32;  // of the conv and dense products (Conv2D, Dense)

  bool training() const { return context != nullptr && context->training; }
};

// A buffer a layer keeps from its forward to its backward: `count` values of `dtype` for a call's members.
struct BufferSpec {
  std::int64_t count;
  DType dtype;
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
  // Model state: variables the forward updates in training and reads in inference, not trained by the
  // optimizer (BatchNorm's moving mean and variance). Default: none.
  virtual std::vector<ParamSpec> state(const Dims& /*input*/) const { return {}; }
  // Buffers kept from forward to backward for a call of c.members members and c.batch examples. Default: none.
  virtual std::vector<BufferSpec> buffers(const LayerCall& /*c*/) const { return {}; }
  // Whether a training call sums over the batch's devices (LayerContext::batch_sum; BatchNorm): a collective.
  virtual bool syncs_batch() const { return false; }
  // Whether the layer draws random numbers (Dropout): the runner numbers such layers (LayerCall::stream).
  virtual bool random() const { return false; }
  // Whether, given one input shared by every member, it gives one shared output (Rescaling): the layers
  // before a model's first parameterized layer must.
  virtual bool keeps_shared() const { return false; }
  // Whether it can read one input shared by every member (LayerCall::shared_input: Conv2D, Dense): a model's
  // first parameterized layer must.
  virtual bool reads_shared() const { return false; }
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
  Init kernel_init = Init::automatic;  // LeCun normal (Flax); Init::glorot_uniform is Keras's
};
std::unique_ptr<Layer> conv2d(std::string name, int features, int kernel = 3);  // SAME padding, stride 1
std::unique_ptr<Layer> conv2d(std::string name, int features, Conv2dOptions options);
std::unique_ptr<Layer> dense(std::string name, int features, Init kernel_init = Init::automatic);

// Keras's BatchNormalization over the last dimension (channels): in training it normalizes with the
// batch's mean and biased variance (of the global batch in data- and model-parallel runs: a psum over the
// batch's devices) and moves the moving statistics, moving = moving * momentum + batch * (1 - momentum); in
// inference it normalizes with the moving statistics. Variables: gamma (scale, ones) and beta (center,
// zeros); state moving_mean (zeros) and moving_variance (ones).
struct BatchNormOptions {
  float momentum = 0.99f;
  float epsilon = 1e-3f;
  bool center = true;  // beta
  bool scale = true;   // gamma
};
std::unique_ptr<Layer> batch_norm(std::string name, BatchNormOptions options = {});
// Keras's Dropout(rate): in training each value is zeroed with probability `rate` and the others scaled by
// 1 / (1 - rate); in inference the identity. The mask of example i at step s of member m depends only on the
// member's key, s, i (its index in the global batch), the value's index and which dropout layer this is
// (kernels/layer_ops.h), so it is the same on any device count and split.
std::unique_ptr<Layer> dropout(std::string name, float rate);
// Keras's Rescaling: x * scale + offset.
std::unique_ptr<Layer> rescaling(float scale, float offset = 0.0f);
std::unique_ptr<Layer> relu();
std::unique_ptr<Layer> avg_pool(int window = 2);  // window = stride, VALID
std::unique_ptr<Layer> flatten();
// Keras's GlobalAveragePooling2D: (H, W, C) -> (C), each channel's mean.
std::unique_ptr<Layer> global_avg_pool();
// Model parallelism (ensemble/layout.h): the whole features from `parts` devices' contiguous blocks of the
// last dimension, (..., F) -> (..., parts x F). Its forward is the collective all_gather(x, axis, -1, tiled)
// over the devices, which ModelRunner runs in the layer's place (the layer's own forward handles only
// parts = 1); its backward takes block LayerCall::block of the output gradient (row by row, Backend::copy).
std::unique_ptr<Layer> gather_features(int parts);

std::int64_t product(const Dims& d);

}  // namespace pmap::ensemble
