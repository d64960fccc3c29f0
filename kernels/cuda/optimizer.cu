// CUDA optimizer ops (kernels/optimizer_ops.h): one item per element for the updates, one per member for
// the per-member scalars and sums, so a host run checks them exactly. The arithmetic is
// kernels/optimizer_math.h's, shared with the CPU ops; no FMA contraction (-fmad=false). Nothing is read
// back to the host: the step counter, learning rates and clipping factors stay in device memory, so a
// captured graph computes them anew at every replay.
#include <pmap/error.h>

#include <cmath>
#include <string>

#include <pmapcc/kernels/cuda/backend.h>
#include <pmapcc/kernels/optimizer_math.h>

namespace pmap::kernels::gpu {
namespace {

struct ScheduleLr {
  ScheduleParams p;
  const std::int64_t* step;
  const float* base_lr;
  float* lr;
  PMAPCC_HD void operator()(std::size_t m) const {
    const double f = schedule_factor(p, *step);
    lr[m] = f == 1.0 ? base_lr[m] : static_cast<float>(base_lr[m] * f);
  }
};

struct AdamStepSize {
  AdamParams p;
  const std::int64_t* step;
  const float* lr;
  float* alpha;
  PMAPCC_HD void operator()(std::size_t m) const { alpha[m] = adam_alpha(p, lr[m], *step); }
};

struct SumSquares {
  std::size_t n;
  const float* x;
  double* sumsq;
  bool accumulate;
  PMAPCC_HD void operator()(std::size_t m) const {
    double acc = 0.0;
    for (std::size_t i = m * n; i < (m + 1) * n; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    sumsq[m] = accumulate ? sumsq[m] + acc : acc;
  }
};

struct ClipFactor {
  const double* sumsq;
  float max_norm;
  float* factor;
  PMAPCC_HD void operator()(std::size_t m) const { factor[m] = clip_scale(sumsq[m], max_norm); }
};

struct SgdTrace {
  SgdParams p;
  std::size_t n;
  const float* lr;
  const float* grads;
  const float* trace;
  float* next;
  float* updates;
  PMAPCC_HD void operator()(std::size_t i) const {
    sgd_trace_element(p, lr[i / n], grads[i], trace[i], next[i], updates[i]);
  }
};

struct Increment {
  std::int64_t* step;
  PMAPCC_HD void operator()(std::size_t) const { ++*step; }
};

std::size_t items(int members) {
  if (members < 1) throw ValueError("optimizer ops: members must be >= 1, got " + std::to_string(members));
  return static_cast<std::size_t>(members);
}

}  // namespace

void CudaOptimizerOps::schedule_lr(ScheduleParams p, int members, const std::int64_t* step, const float* base_lr,
                                   float* lr) const {
  validate(p);
  require(step, "schedule_lr", "step");
  require(base_lr, "schedule_lr", "base_lr");
  require(lr, "schedule_lr", "lr");
  ex_.launch(ScheduleLr{p, step, base_lr, lr}, items(members));
}

void CudaOptimizerOps::adam_step_size(AdamParams p, int members, const std::int64_t* step, const float* lr,
                                      float* alpha) const {
  validate(p);
  require(step, "adam_step_size", "step");
  require(lr, "adam_step_size", "lr");
  require(alpha, "adam_step_size", "alpha");
  ex_.launch(AdamStepSize{p, step, lr, alpha}, items(members));
}

void CudaOptimizerOps::sum_squares(int members, std::size_t n, const float* x, double* sumsq, bool accumulate) const {
  require(x, "sum_squares", "x");
  require(sumsq, "sum_squares", "sumsq");
  ex_.launch(SumSquares{n, x, sumsq, accumulate}, items(members));
}

void CudaOptimizerOps::clip_factor(int members, const double* sumsq, float max_norm, float* factor) const {
  require(sumsq, "clip_factor", "sumsq");
  require(factor, "clip_factor", "factor");
  if (!(max_norm > 0) || !std::isfinite(max_norm)) throw ValueError("clip_factor: max_norm must be a positive number");
  ex_.launch(ClipFactor{sumsq, max_norm, factor}, items(members));
}

void CudaOptimizerOps::sgd_trace(SgdParams p, int members, std::size_t n, const float* lr, const float* grads,
                                 const float* trace, float* next, float* updates) const {
  validate(p);
  require(lr, "sgd_trace", "lr");
  require(grads, "sgd_trace", "grads");
  require(trace, "sgd_trace", "trace");
  require(next, "sgd_trace", "next");
  require(updates, "sgd_trace", "updates");
  ex_.launch(SgdTrace{p, n, lr, grads, trace, next, updates}, items(members) * n);
}

void CudaOptimizerOps::increment(std::int64_t* step) const {
  require(step, "increment", "step");
  ex_.launch(Increment{step}, 1);
}

}  // namespace pmap::kernels::gpu
