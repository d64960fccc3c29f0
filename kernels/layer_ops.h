// LayerOps: the op family of the layers that carry model state or randomness, BatchNormalization and
// Dropout, and of the element-wise layers, ReLU and Rescaling, with one CPU implementation
// (kernels/cpu/layers.cpp, the ReLU's elementwise.cpp) and one CUDA one (kernels/cuda/layers.cu, the
// ReLU's elementwise.cu). The per-element and per-channel arithmetic is written once, in
// kernels/layer_math.h, so the CPU ops and the CUDA kernels run on the host give the same bits.
//
// Tensors are member-major: x (M, R, C) for BatchNorm, R rows of C channels per member (for images R is
// N * H * W, channels last); (M, N, F) for Dropout, N examples of F values. Nothing is read back to the
// host: the step counter and the members' random keys are device memory, so a captured CUDA graph draws
// new masks at every replay.
//
// BatchNormalization in training runs as four ops around the collectives a data-parallel run needs:
//   batch_norm_sums -> [psum of the sums over the batch's devices] -> batch_norm_statistics ->
//   batch_norm_apply                                           (forward)
//   batch_norm_backward_sums -> [psum] -> batch_norm_backward  (backward)
// so the statistics are those of the global batch on any number of devices. Sums are double, each
// channel's in row order; everything per element is float without FMA contraction.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pmap::kernels {

struct BatchNormParams {
  int members = 1;
  std::int64_t rows = 1;  // per member
  int channels = 1;
  float epsilon = 1e-3f;   // Keras's default
  float momentum = 0.99f;  // Keras's convention: moving = moving * momentum + batch * (1 - momentum)
  bool relu = false;       // batch_norm_apply: max(., 0) on the output (a following ReLU fused)
};

// Dropout's mask: element (m, i, f) is kept when the word drawn for it is at least the threshold
// floor(rate * 2^32 + 1/2) (at most 2^32 - 1), and then scaled by 1 / (1 - rate) (inverted dropout, as Keras),
// with member m's rate (rates[m], or rate for every member). The word is word g % 4
// of Philox4x32-10 (kernels/layer_math.h) of the counter (example_offset + i, g / 4, *step, stream) under
// member m's key, with g = feature_offset + f: a function of the member's key, the step, the example's index
// in the global batch, the feature's index in the whole layer and the layer's stream only, never of the
// device count or how the batch or the features are split.
struct DropoutParams {
  int members = 1;
  std::int64_t rows = 1;            // examples per member
  std::int64_t features = 1;        // values per example
  float rate = 0.5f;                // in [0, 1)
  std::int64_t example_offset = 0;  // the global index of row 0
  std::int64_t feature_offset = 0;  // the index of feature 0 among the layer's whole features (model parallel)
  const float* rates = nullptr;     // (M) f32, device, nullable: member m's rate in place of `rate` (each in [0, 1))
  std::uint32_t stream = 0;         // which dropout layer of the model
};

class LayerOps {
 public:
  virtual ~LayerOps() = default;

  // sums (M, 2, C) f64: per member and channel, the sum of x and of x^2 over the rows.
  virtual void batch_norm_sums(BatchNormParams p, const float* x, double* sums) const = 0;
  // stats (M, 2, C) f32: the mean and 1 / sqrt(variance + epsilon) that batch_norm_apply uses. Training:
  // from sums over `count` rows (mean = sum / count, variance = max(sum of squares / count - mean^2, 0)),
  // and the moving statistics (M, C) f32 are updated with them (the biased variance, as Keras). Inference
  // (sums null): from the moving statistics, which are left as they are.
  virtual void batch_norm_statistics(BatchNormParams p, const double* sums, double count, float* moving_mean,
                                     float* moving_variance, float* stats) const = 0;
  // y (M, R, C) = (x - mean) * inv_std * gamma + beta; gamma (M, C) and beta (M, C) nullable (scale=False,
  // center=False); y may be x.
  virtual void batch_norm_apply(BatchNormParams p, const float* x, const float* stats, const float* gamma,
                                const float* beta, float* y) const = 0;
  // sums (M, 2, C) f64: the sums of dy and of dy * x_hat over the rows (x_hat = (x - mean) * inv_std); dgamma and
  // dbeta (M, C), nullable, are written with them (this device's share).
  virtual void batch_norm_backward_sums(BatchNormParams p, const float* x, const float* dy, const float* stats,
                                        double* sums, float* dgamma, float* dbeta) const = 0;
  // dx (M, R, C) = gamma * inv_std * (dy - sum(dy) / count - x_hat * sum(dy * x_hat) / count), with the sums
  // of the whole batch (count rows); gamma nullable (1).
  virtual void batch_norm_backward(BatchNormParams p, const float* x, const float* dy, const float* stats,
                                   const double* sums, double count, const float* gamma, float* dx) const = 0;

  // y (M, N, F) = x with Dropout's mask applied; keys (M, 2) u32, step (1) i64. The same op on an output
  // gradient gives the input gradient. y may be x.
  virtual void dropout(DropoutParams p, const std::uint32_t* keys, const std::int64_t* step, const float* x,
                       float* y) const = 0;

  // y (n) = x * scale + offset (Keras's Rescaling); y may be x.
  virtual void scale_shift(std::size_t n, const float* x, float scale, float offset, float* y) const = 0;

  // y = max(x, 0) over n elements (any shape; members folded in). In place allowed (y == x). NaN stays NaN.
  virtual void relu_forward(std::size_t n, const float* x, float* y) const = 0;

  // dx = dy where y > 0, else 0, over n elements, from the forward's OUTPUT y (y > 0 exactly where x > 0;
  // the gradient at 0 is 0, as in JAX). In place allowed (dx == dy).
  virtual void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const = 0;
};

// Parameter checks shared by the implementations (ValueError naming the field).
void validate(const BatchNormParams& p);
void validate(const DropoutParams& p);

}  // namespace pmap::kernels
