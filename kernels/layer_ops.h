// LayerOps: the op family of the layers that carry model state or randomness, BatchNormalization and
// Dropout, and of Keras's Rescaling, with one CPU implementation (kernels/cpu/layers.cpp) and one CUDA one
// (kernels/cuda/layers.cu). The per-element and per-channel arithmetic is written once, in
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

#include <pmapcc/kernels/op_list.h>

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

  // The ops, each with its contract: kernels/layer_ops.def.
#define PMAPCC_OP PMAPCC_OP_VIRTUAL
#include <pmapcc/kernels/layer_ops.def>
};

// Parameter checks shared by the implementations (ValueError naming the field).
void validate(const BatchNormParams& p);
void validate(const DropoutParams& p);

}  // namespace pmap::kernels
