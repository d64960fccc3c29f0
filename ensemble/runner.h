// ModelRunner: one device's forward and backward passes of a Sequential for M members, with every
// activation, gradient and workspace buffer allocated once, up front, on that device; forward and backward
// allocate nothing (host or device), so a graph can capture them. The input batch is shared by all
// members (ensemble training: every member sees the same batch). ReLUs are fused: a conv/dense layer
// applies the ReLU after it in its forward, and an avg_pool after a ReLU runs its backward through the
// ReLU, writing the gradient over the ReLU's output, which then needs no buffer of its own.
//
// Members are independent in an ensemble, so the runner can hold the activations of only a group of them
// and run the members group by group (forward and backward of one group, then the next): activation
// memory is then group / M of running all M at once. A member's results do not depend on the group it
// runs in (every kernel's per-member results are independent of its member count).
//
// Model parallelism (layout.h): run with a RunnerSplit, the runner runs a local model (a device's blocks of
// the weights) inside a pmap and issues the collectives its layers' splits need over their mesh axes, as
// Megatron does: after a row-parallel layer's forward a psum of its partial outputs (the bias added on the
// axis's first device only), and after a column-parallel layer's backward a psum of its input gradient.
// Between a column- and a row-parallel layer the activations stay split: no collective. A GatherFeatures
// layer (column-parallel outputs that a whole layer reads) is an all_gather along the last axis.
//
// The constructor compiles the model once into two lists of RunnerSteps, one per pass: which layer runs,
// the ReLU it fuses, whether it runs its block of a split axis, and the collective after it. forward and
// backward are then straight loops over them, and a new split pattern or fusion is a change to the
// compilation, not to the loops.
#pragma once

#include <array>
#include <string>
#include <vector>

#include <pmap/array.h>

#include <pmapcc/ensemble/layout.h>
#include <pmapcc/ensemble/model.h>

namespace pmap::ensemble {

// How the layers of a local model are split (LocalModel::splits), and the names of the mesh axes that
// LayerSplit::axis indexes. Empty: nothing is split. batch_axis: the mesh axis the global batch is spread
// over (data- and model-parallel runs), over which BatchNorm sums its batch statistics; empty: this
// device has the whole batch.
struct RunnerSplit {
  std::vector<LayerSplit> layers;
  std::vector<std::string> axes;
  std::string batch_axis;
};

// What a forward needs beyond its input and parameters: the model state of all the runner's members
// (members * S, the model's state layout, on the device; required when the model has state, which a
// training forward updates), and for training the members' random keys ((members, 2) u32), the step
// counter, the global index of this device's first example and, nullable, each member's dropout rate
// ((members) f32, in place of the Dropout layers' own) (layers.h's LayerContext).
struct RunArgs {
  float* state = nullptr;
  bool training = false;
  const std::uint32_t* keys = nullptr;
  const std::int64_t* step = nullptr;
  std::int64_t example_offset = 0;
  const float* dropout_rates = nullptr;
};

// One step of a compiled pass (ModelRunner::forward_steps(), backward_steps()).
struct RunnerStep {
  // The collective after the step, over `axis`: a psum of the layer's output (forward: a row-parallel
  // layer's partial sums) or of its input gradient (backward: a column-parallel layer's, summed over its
  // output blocks).
  enum class Collective { none, psum_output, psum_input_grad };
  std::size_t layer = 0;
  // forward: the layer also applies the ReLU that follows it (layer + 1, then no step of its own);
  // backward: the layer runs backward_through_relu for the ReLU before it (layer - 1, likewise).
  bool fused_relu = false;
  bool block = false;          // LayerCall::block is this device's index along `axis` (gather, blocks)
  bool bias_on_first = false;  // forward: the bias counts on the axis's first device only (others add zeros)
  // forward: the step is the collective all_gather(input, axis, -1, tiled) in place of the layer's forward
  // (a GatherFeatures layer: each device's block of the last dimension, concatenated in axis order).
  bool gather = false;
  bool input_grad = true;      // backward: the input gradient is computed (not where the input is the batch)
  Collective after = Collective::none;
  int axis = -1;  // index into RunnerSplit::axes; -1: the layer is not split
};

class ModelRunner {
 public:
  // Buffers for up to max_batch examples of `group` of the `members` members at a time (0: all of them)
  // on `device`, whose memory `backend` works on (ValueError otherwise). With a split, forward and backward
  // must run inside a pmap over a mesh with those axes. `precision`: of the conv and dense products
  // (kernels::Precision; ValueError where the backend cannot run it).
  ModelRunner(const Sequential& model, const kernels::Backend& backend, Device device, int members, int max_batch,
              int group = 0, RunnerSplit split = {}, kernels::Precision precision = kernels::Precision::fp32);

  int members() const { return members_; }
  int group() const { return group_; }
  int max_batch() const { return max_batch_; }
  const Device& device() const { return device_; }
  const Sequential& model() const { return model_; }
  const kernels::Backend& backend() const { return backend_; }

  // Runs the layers for members [first, first + count) (count <= group()) on x (batch, *input) (device
  // memory), with params (members * P, the model's layout) on the device. Returns their logits
  // (count, batch, classes), valid until the next forward.
  const float* forward(const float* x, int batch, const float* params, int first, int count,
                       const RunArgs& run = {});
  // All members at once; needs group() == members().
  const float* forward(const float* x, int batch, const float* params, const RunArgs& run = {}) {
    return forward(x, batch, params, 0, members_, run);
  }
  // Gradients of the loss w.r.t. the params of the last forward's members, written to their blocks of
  // grads (members * P; the other members' blocks are untouched), given their dlogits (count, batch,
  // classes) for the last forward (same x, batch and params), which was a training one where the model has
  // layers that behave differently in training (BatchNorm, Dropout).
  void backward(const float* x, const float* params, const float* dlogits, float* grads);

  // The compiled passes: forward's steps in order, and backward's (from the last layer down to the first
  // that has something to train).
  const std::vector<RunnerStep>& forward_steps() const { return forward_steps_; }
  const std::vector<RunnerStep>& backward_steps() const { return backward_steps_; }

 private:
  static constexpr std::size_t kMaxLayerTensors = 8;
  LayerCall call(std::size_t layer, int batch, int members);
  void compile(const std::vector<bool>& relu_forward, const std::vector<bool>& relu_backward);
  const std::string& axis_of(const RunnerStep& step) const;  // the mesh axis of a split step
  // Layer i's tensors for the members of the last forward, from a buffer of all members' tensors.
  template <class P>
  auto tensors_of(const std::vector<const TensorSlot*>& list, P* base) const -> std::array<P*, kMaxLayerTensors>;

  const Sequential& model_;
  const kernels::Backend& backend_;
  Device device_;
  int members_;
  int group_;
  int max_batch_;
  int batch_ = 0;      // the last forward's batch (0: none yet), first member and member count
  int first_ = 0;
  int count_ = 0;
  const float* params_ = nullptr;
  std::vector<Array> storage_;       // activation and gradient buffers
  std::vector<float*> act_;          // act_[i]: input of layer i (act_[0] is the caller's x); act_[L]: logits
  std::vector<float*> grad_;         // grad_[i]: dL/d act_[i] (grad_[0] unused)
  std::vector<RunnerStep> forward_steps_;
  std::vector<RunnerStep> backward_steps_;
  std::vector<std::vector<const TensorSlot*>> layer_tensors_;  // per layer, its parameter tensors
  std::vector<std::vector<const TensorSlot*>> layer_state_;    // per layer, its state tensors
  std::vector<std::vector<Array>> layer_buffers_;              // per layer, its buffers() for a group
  std::vector<bool> shared_;                   // shared_[i]: act_[i] is one batch every member reads
  std::vector<std::uint32_t> stream_;          // per layer, its number among the random() layers
  bool trains_differently_ = false;            // some layer has state or randomness
  bool random_ = false;                        // some layer has randomness
  RunArgs run_;                                // the last forward's
  LayerContext context_;
  std::array<float*, kMaxLayerTensors> state_of(std::size_t layer);
  Array workspace_;
  RunnerSplit split_;
  kernels::Precision precision_;
  std::vector<int> act_store_;   // act_store_[i]: the storage_ index of act_[i]'s buffer, or -1
  std::vector<int> grad_store_;  // grad_store_[i]: the storage_ index of grad_[i]'s buffer, or -1
  Array zero_bias_;              // zeros for a row-parallel layer's bias off the axis's first device
  void gather_features(const RunnerStep& step);
};

}  // namespace pmap::ensemble
