// ModelRunner: one device's forward and backward passes of a Sequential for M members, with every
// activation, gradient and workspace buffer allocated once, up front, on that device. The input batch
// is shared by all members (ensemble training: every member sees the same batch). Where the backend fuses
// ReLUs (Backend::fused_relu()), a conv/dense layer applies the ReLU after it in its forward, and an
// avg_pool after a ReLU runs its backward through the ReLU, writing the gradient over the ReLU's output:
// that gradient then needs no buffer of its own.
#pragma once

#include <vector>

#include <pmap/array.h>

#include "ensemble/model.h"

namespace pmap::ensemble {

class ModelRunner {
 public:
  // Buffers for up to max_batch examples of `members` members on `device`.
  ModelRunner(const Sequential& model, Device device, int members, int max_batch);

  int members() const { return members_; }
  int max_batch() const { return max_batch_; }
  const Device& device() const { return device_; }
  const Sequential& model() const { return model_; }

  // Runs the layers on x (batch, *input) (device memory), with params (members * P) on the device.
  // Returns the logits (members, batch, classes), valid until the next forward.
  const float* forward(const float* x, int batch, const float* params);
  // Gradients of the loss w.r.t. the params, written to grads (members * P), given dlogits
  // (members, batch, classes) for the last forward (same x, batch and params).
  void backward(const float* x, const float* params, const float* dlogits, float* grads);

 private:
  LayerCall call(std::size_t layer, int batch) const;
  std::vector<const float*> param_ptrs(std::size_t layer, const float* base) const;
  std::vector<float*> grad_ptrs(std::size_t layer, float* base) const;

  const Sequential& model_;
  const kernels::Backend& backend_;
  Device device_;
  int members_;
  int max_batch_;
  int batch_ = 0;
  std::vector<Array> storage_;       // activation and gradient buffers
  std::vector<float*> act_;          // act_[i]: input of layer i (act_[0] is the caller's x); act_[L]: logits
  std::vector<float*> grad_;         // grad_[i]: dL/d act_[i] (grad_[0] unused)
  std::vector<bool> relu_forward_;   // layer i applies the ReLU i + 1 in its forward (which is then skipped)
  std::vector<bool> relu_backward_;  // layer i's backward runs through the ReLU i - 1 (then skipped), writing
                                     // its input gradient over act_[i]
  Array workspace_;
};

}  // namespace pmap::ensemble
