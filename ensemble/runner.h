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
#pragma once

#include <array>
#include <vector>

#include <pmap/array.h>

#include <pmapcc/ensemble/model.h>

namespace pmap::ensemble {

class ModelRunner {
 public:
  // Buffers for up to max_batch examples of `group` of the `members` members at a time (0: all of them)
  // on `device`, whose memory `backend` works on (ValueError otherwise).
  ModelRunner(const Sequential& model, const kernels::Backend& backend, Device device, int members, int max_batch,
              int group = 0);

  int members() const { return members_; }
  int group() const { return group_; }
  int max_batch() const { return max_batch_; }
  const Device& device() const { return device_; }
  const Sequential& model() const { return model_; }
  const kernels::Backend& backend() const { return backend_; }

  // Runs the layers for members [first, first + count) (count <= group()) on x (batch, *input) (device
  // memory), with params (members * P, the model's layout) on the device. Returns their logits
  // (count, batch, classes), valid until the next forward.
  const float* forward(const float* x, int batch, const float* params, int first, int count);
  // All members at once; needs group() == members().
  const float* forward(const float* x, int batch, const float* params) {
    return forward(x, batch, params, 0, members_);
  }
  // Gradients of the loss w.r.t. the params of the last forward's members, written to their blocks of
  // grads (members * P; the other members' blocks are untouched), given their dlogits (count, batch,
  // classes) for the last forward (same x, batch and params).
  void backward(const float* x, const float* params, const float* dlogits, float* grads);

 private:
  static constexpr std::size_t kMaxLayerTensors = 8;
  LayerCall call(std::size_t layer, int batch, int members) const;
  // Layer i's tensors for the members of the last forward, from a buffer of all members' tensors.
  template <class P> auto tensors_of(std::size_t layer, P* base) const -> std::array<P*, kMaxLayerTensors>;

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
  std::vector<bool> relu_forward_;   // layer i applies the ReLU i + 1 in its forward (which is then skipped)
  std::vector<bool> relu_backward_;  // layer i's backward runs through the ReLU i - 1 (then skipped), writing
                                     // its input gradient over act_[i]
  std::vector<std::vector<const TensorSlot*>> layer_tensors_;  // per layer, its parameter tensors
  Array workspace_;
};

}  // namespace pmap::ensemble
