// Backend: the numeric ops of kernels/ops.h behind one small interface, so the training layer runs the
// same code on CPU devices (Eigen) and CUDA devices. backend_for(kind) returns the process-wide instance;
// the CUDA one throws NotAvailable in builds without CUDA. Shapes and semantics are those of ops.h; every
// call is blocking with respect to the calling thread's device (CUDA: its stream is synchronized before
// results are read on the host).
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmap/device.h>

#include "kernels/ops.h"

namespace pmap::kernels {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::size_t conv2d_workspace_bytes(const Conv2dParams& p) const = 0;
  virtual void conv2d_forward(const Conv2dParams& p, const float* x, const float* w, const float* b, float* y,
                              void* workspace) const = 0;
  virtual void conv2d_backward(const Conv2dParams& p, const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db, void* workspace) const = 0;
  virtual void avg_pool_forward(const AvgPoolParams& p, const float* x, float* y) const = 0;
  virtual void avg_pool_backward(const AvgPoolParams& p, const float* dy, float* dx) const = 0;
  virtual std::size_t dense_workspace_bytes(const DenseParams& p) const = 0;
  virtual void dense_forward(const DenseParams& p, const float* x, const float* w, const float* b, float* y,
                             void* workspace) const = 0;
  virtual void dense_backward(const DenseParams& p, const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* db, void* workspace) const = 0;
  virtual void relu_forward(std::size_t n, const float* x, float* y) const = 0;
  virtual void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const = 0;
  // loss and correct are host pointers (M entries); logits/labels/dlogits/probs live on the device.
  virtual void softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels,
                                     float* loss, float* dlogits, float* probs, std::int32_t* correct) const = 0;
  virtual void sgd_momentum_update(const SgdParams& p, std::size_t n, float* params, float* momentum,
                                   const float* grads) const = 0;

  // Fused ReLU (optional; the training layer uses it where fused_relu() is true): Conv2dParams::relu and
  // DenseParams::relu are honoured, and avg_pool_relu_backward exists (the default throws NotAvailable).
  virtual bool fused_relu() const { return false; }
  virtual void avg_pool_relu_backward(const AvgPoolParams& p, const float* r, const float* dy, float* dx) const;
};

const Backend& backend_for(DeviceKind kind);

}  // namespace pmap::kernels
