// DenseOps: the op family of fully connected layers, y = x @ w + b for each member. One implementation per
// CPU ISA variant (kernels/cpu/dense.cpp) and one CUDA one (kernels/cuda/dense.cu). Pointers are in the
// memory of the backend's device and ops are ordered as kernels/backend.h says; DenseParams is
// kernels/ops.h's.
#pragma once

#include <cstddef>

#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

class DenseOps {
 public:
  virtual ~DenseOps() = default;

  // Bytes of scratch memory dense_forward and dense_backward need (CPU: GEMM packing space; CUDA: the
  // bias-gradient partial sums of tall batches, 0 for up to 256 rows).
  virtual std::size_t dense_workspace_bytes(DenseParams p) const = 0;

  // y = x @ w + b (and max(., 0) with p.relu).  x (M, N, I), or (N, I) with shared_input;  w (M, I, O);
  // b (M, O) or nullptr;  y (M, N, O), written. Not in place. workspace: dense_workspace_bytes(p) bytes or
  // nullptr.
  virtual void dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y,
                             void* workspace) const = 0;

  // Gradients of dense_forward given dy (M, N, O):
  //   dx (M, N, I), or (N, I) summed over members with shared_input; nullptr: not computed
  //   dw (M, I, O)   db (M, O), nullptr: not computed
  virtual void dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* db, void* workspace) const = 0;
};

}  // namespace pmap::kernels
