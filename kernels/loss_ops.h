// LossOps: the op family of the training loss, softmax cross-entropy, and of per-member reductions. One
// implementation per CPU ISA variant (kernels/cpu/loss.cpp) and one CUDA one (kernels/cuda/loss.cu).
// Pointers are in the memory of the backend's device and ops are ordered as kernels/backend.h says;
// SoftmaxXentParams is kernels/ops.h's.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

class LossOps {
 public:
  virtual ~LossOps() = default;

  // Bytes of workspace softmax_cross_entropy needs (CPU: 0; CUDA: a loss term and a hit flag per row).
  virtual std::size_t softmax_cross_entropy_workspace_bytes(SoftmaxXentParams p) const = 0;

  // From logits (M, N, K) and labels (N) int32 in [0, K) ((M, N) without shared_labels), each output
  // optional (nullptr: not computed), all in the device's memory:
  //   loss (M): mean over the batch of -log softmax(logits)[label], computed with log-sum-exp (stable for
  //             any finite logits), accumulated in double
  //   dlogits (M, N, K): d(loss_m)/d(logits) = (softmax - onehot(label)) / N
  //   probs (M, N, K): softmax(logits)
  //   correct (M): how many rows have argmax(logits) == label (first index on ties, as jnp.argmax)
  // labels may be nullptr when only probs is asked for. A label outside [0, K): the CPU backends raise
  // ValueError; a kernel cannot raise, so the CUDA backend skips the row (its loss term 0, its dlogits row
  // zero) and adds it to *bad_labels (device i32, optional; the caller zeroes it and checks it when it
  // reads its results; with shared labels a bad label counts once). workspace: the bytes above, or null.
  virtual void softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels,
                                     float* loss, float* dlogits, float* probs, std::int32_t* correct,
                                     std::int32_t* bad_labels, void* workspace) const = 0;

  // out[m] = sum of x[m * n .. m * n + n), for x (M, n); accumulated in double in index order, rounded
  // once. out (M).
  virtual void reduce_sum(int members, std::size_t n, const float* x, float* out) const = 0;

  // out[m] = reduce_sum / n. out (M). n must be > 0.
  virtual void reduce_mean(int members, std::size_t n, const float* x, float* out) const = 0;
};

}  // namespace pmap::kernels
