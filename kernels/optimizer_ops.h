// OptimizerOps: the op family of what pmapcc/optim computes on the device beside its element-wise ops:
// learning-rate schedules, Adam's step size, gradient clipping by global norm, optax.sgd's update in one pass
// and the step counter, with one CPU implementation (kernels/cpu/optimizer.cpp) and one CUDA one
// (kernels/cuda/optimizer.cu). Every value that changes between steps or between members (the learning rate,
// Adam's step size, the clipping factor) is read from device memory, never passed by value, so a captured
// CUDA graph computes the right values at every replay.
//
// sgd_trace and sum_squares work on one parameter tensor of M members at a time: (M, n) blocks, member-major,
// and read per-member scalars from (M) device arrays. The per-element arithmetic is float, in a fixed order
// and without FMA contraction, and the per-member scalars (schedule factors, Adam's step size, norms) double:
// the CPU ops and the CUDA kernels run on the host give the same bits (the CPU ops are the oracle); on a
// GPU, CUDA's cos, pow and sqrt in double may differ from glibc's in the last bit. sum_squares runs one
// GPU thread per member over the tensor: right, but slow on a GPU for large tensors (--clip-norm).
#pragma once

#include <math.h>  // cos, pow, floor: glibc on the host, CUDA's on the device

#include <cstddef>
#include <cstdint>

#include <pmap/detail/launch.h>

#include <pmapcc/kernels/op_list.h>

namespace pmap::kernels {

// A learning-rate schedule as a factor of the base rate at step t (the number of updates already made).
// For t < warmup_steps, a linear warmup from 0 (optax's linear_schedule to the peak): t / warmup_steps.
// After it, with s = t - warmup_steps:
//   constant:    1
//   piecewise:   values[i] for the last boundaries[i] <= s (1 before the first boundary)
//   exponential: decay_rate ^ (s / decay_steps)   (floor(s / decay_steps) with staircase)
//   cosine:      alpha + (1 - alpha) * 0.5 * (1 + cos(pi * min(s, decay_steps) / decay_steps))
// The factor is computed in double and multiplied into the float base rate once; constant without warmup
// gives the base rate bit for bit.
enum class ScheduleKind : std::int32_t { constant, piecewise, exponential, cosine };
inline constexpr int kMaxScheduleBoundaries = 8;
struct ScheduleParams {
  ScheduleKind kind = ScheduleKind::constant;
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 1;  // exponential: the transition steps; cosine: the decay's length
  double decay_rate = 1.0;       // exponential
  bool staircase = false;        // exponential
  double alpha = 0.0;            // cosine: the final factor
  int boundaries_count = 0;      // piecewise
  std::int64_t boundaries[kMaxScheduleBoundaries] = {};
  double values[kMaxScheduleBoundaries] = {};
};

// The schedule's factor at step t, in double: the one formula the CPU op and the CUDA kernel use (on a
// GPU, CUDA's cos and pow may differ from glibc's in the last bit).
PMAPCC_HD inline double schedule_factor(const ScheduleParams& p, std::int64_t t) {
  if (t < p.warmup_steps) return static_cast<double>(t) / static_cast<double>(p.warmup_steps);
  const std::int64_t s = t - p.warmup_steps;
  switch (p.kind) {
    case ScheduleKind::constant:
      return 1.0;
    case ScheduleKind::piecewise: {
      double f = 1.0;
      for (int i = 0; i < p.boundaries_count; ++i)
        if (s >= p.boundaries[i]) f = p.values[i];
      return f;
    }
    case ScheduleKind::exponential: {
      double e = static_cast<double>(s) / static_cast<double>(p.decay_steps);
      if (p.staircase) e = floor(e);
      return pow(p.decay_rate, e);
    }
    case ScheduleKind::cosine: {
      const double done =
          static_cast<double>(s < p.decay_steps ? s : p.decay_steps) / static_cast<double>(p.decay_steps);
      return p.alpha + (1.0 - p.alpha) * 0.5 * (1.0 + cos(3.14159265358979323846 * done));
    }
  }
  return 1.0;
}

// SGD with momentum, optax.sgd semantics: m <- momentum * m + g; p <- p - lr * m. nesterov (optax
// nesterov=True): p <- p - lr * (g + momentum * m_new).
struct SgdParams {
  float momentum = 0.9f;
  bool nesterov = false;
};

// Adam as Keras computes it (keras.optimizers.Adam; optim::Adam from the ops; epsilon is added to sqrt(v)
// before the bias correction, the paper's "epsilon hat"): with t = step + 1,
//   m <- m + (g - m) * (1 - beta_1);  v <- v + (g^2 - v) * (1 - beta_2)
//   p <- p - alpha * m / (sqrt(v) + epsilon),  alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
// The betas are doubles: 1 - beta and beta^t are computed in double (Keras 3 rounds them to float32 first,
// so the step size can differ from Keras's in its last bits).
struct AdamParams {
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  float epsilon = 1e-7f;
};

// Adam's bias-corrected step size for a learning rate at step t (t updates made before this one).
PMAPCC_HD inline float adam_alpha(const AdamParams& p, float lr, std::int64_t t) {
  const double n = static_cast<double>(t + 1);
  const double c = sqrt(1.0 - pow(p.beta_2, n)) / (1.0 - pow(p.beta_1, n));
  return static_cast<float>(static_cast<double>(lr) * c);
}

class OptimizerOps {
 public:
  virtual ~OptimizerOps() = default;

  // The ops, each with its contract: kernels/optimizer_ops.def.
#define PMAPCC_OP PMAPCC_OP_VIRTUAL
#include <pmapcc/kernels/optimizer_ops.def>
};

// Validation (backend-neutral); each throws pmap::ValueError naming the bad field.
void validate(const ScheduleParams& p);
void validate(const SgdParams& p);
void validate(const AdamParams& p);

}  // namespace pmap::kernels
