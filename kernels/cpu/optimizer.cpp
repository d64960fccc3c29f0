// CPU optimizer ops (kernels/optimizer_ops.h): plain loops, the oracle of the CUDA kernels. Compiled
// without FMA contraction, so every ISA variant gives the same bits.
#include <pmap/error.h>

#include <cmath>
#include <string>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/cpu/ops.h>
#include <pmapcc/kernels/optimizer_math.h>

namespace PMAPCC_CPU_NS {
namespace {

void check_members(const char* op, int members) {
  if (members < 1) throw ValueError(std::string(op) + ": members must be >= 1, got " + std::to_string(members));
}

}  // namespace

void OptimizerOpsImpl::schedule_lr(ScheduleParams p, int members, const std::int64_t* step, const float* base_lr,
                                   float* lr) const {
  validate(p);
  check_members("schedule_lr", members);
  detail::require(step, "schedule_lr", "step");
  detail::require(base_lr, "schedule_lr", "base_lr");
  detail::require(lr, "schedule_lr", "lr");
  const double f = schedule_factor(p, *step);
  for (int m = 0; m < members; ++m) lr[m] = f == 1.0 ? base_lr[m] : static_cast<float>(base_lr[m] * f);
}

void OptimizerOpsImpl::adam_step_size(AdamParams p, int members, const std::int64_t* step, const float* lr,
                                      float* alpha) const {
  validate(p);
  check_members("adam_step_size", members);
  detail::require(step, "adam_step_size", "step");
  detail::require(lr, "adam_step_size", "lr");
  detail::require(alpha, "adam_step_size", "alpha");
  for (int m = 0; m < members; ++m) alpha[m] = adam_alpha(p, lr[m], *step);
}

void OptimizerOpsImpl::sum_squares(int members, std::size_t n, const float* x, double* sumsq, bool accumulate) const {
  check_members("sum_squares", members);
  detail::require(x, "sum_squares", "x");
  detail::require(sumsq, "sum_squares", "sumsq");
  for (int m = 0; m < members; ++m) {
    double acc = 0.0;
    const float* xm = x + static_cast<std::size_t>(m) * n;
    for (std::size_t i = 0; i < n; ++i) acc += static_cast<double>(xm[i]) * static_cast<double>(xm[i]);
    sumsq[m] = accumulate ? sumsq[m] + acc : acc;
  }
}

void OptimizerOpsImpl::clip_factor(int members, const double* sumsq, float max_norm, float* factor) const {
  check_members("clip_factor", members);
  detail::require(sumsq, "clip_factor", "sumsq");
  detail::require(factor, "clip_factor", "factor");
  if (!(max_norm > 0) || !std::isfinite(max_norm)) throw ValueError("clip_factor: max_norm must be a positive number");
  for (int m = 0; m < members; ++m) factor[m] = clip_scale(sumsq[m], max_norm);
}

void OptimizerOpsImpl::sgd_trace(SgdParams p, int members, std::size_t n, const float* lr, const float* grads,
                                 const float* trace, float* next, float* updates) const {
  validate(p);
  check_members("sgd_trace", members);
  detail::require(lr, "sgd_trace", "lr");
  detail::require(grads, "sgd_trace", "grads");
  detail::require(trace, "sgd_trace", "trace");
  detail::require(next, "sgd_trace", "next");
  detail::require(updates, "sgd_trace", "updates");
  for (int mb = 0; mb < members; ++mb) {
    const std::size_t o = static_cast<std::size_t>(mb) * n;
    const float r = lr[mb];
    for (std::size_t i = o; i < o + n; ++i) sgd_trace_element(p, r, grads[i], trace[i], next[i], updates[i]);
  }
}

void OptimizerOpsImpl::increment(std::int64_t* step) const {
  detail::require(step, "increment", "step");
  ++*step;
}

}  // namespace PMAPCC_CPU_NS
