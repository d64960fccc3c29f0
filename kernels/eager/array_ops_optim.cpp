// pmap::ops::eager's optimizer scalars (kernels/eager/array_ops_optim.h): each checks its operands and runs the
// device's OptimizerOps (kernels/optimizer_ops.h) on one member, or on one value per member.
#include <pmapcc/kernels/eager/array_ops_optim.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <pmap/collectives.h>
#include <pmap/error.h>

#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>

#include "array_ops_checks.h"

namespace pmap::ops::eager {
using namespace detail;  // the checks of array_ops_checks.h
namespace {

void require_step(const char* fn, const Array& step) {
  require_dtype(fn, "step", step, DType::i64);
  if (step.size() != 1) {
    throw ShapeError(std::string("ops::") + fn + ": step is " + step.signature() + "; it must be one i64 value");
  }
}

// One f32 value or several (one per member), on step's device.
void require_floats(const char* fn, const char* arg, const Array& x, const Array& step) {
  require_dtype(fn, arg, x, DType::f32);
  require_same_device(fn, x, arg, step, "step");
  if (x.size() < 1 || x.size() > std::numeric_limits<int>::max()) {
    throw ShapeError(std::string("ops::") + fn + ": " + arg + " is " + x.signature() +
                     "; it must hold one f32 value, or one per member");
  }
}

}  // namespace

Array schedule_lr(const kernels::ScheduleParams& schedule, float learning_rate, const Array& step) {
  require_step("schedule_lr", step);
  kernels::validate(schedule);
  const Array base = scale(zeros_on(__func__, Shape{1}, DType::f32, step.device()), 0.0f, learning_rate);  // 0*0 + lr
  return schedule_lr(schedule, base, step);
}

Array schedule_lr(const kernels::ScheduleParams& schedule, const Array& learning_rates, const Array& step) {
  require_step("schedule_lr", step);
  require_floats("schedule_lr", "learning_rates", learning_rates, step);
  kernels::validate(schedule);
  const kernels::Backend& be = backend_of("schedule_lr", step.device());
  Array lr = zeros_on(__func__, learning_rates.shape(), DType::f32, step.device());
  be.optimizer().schedule_lr(schedule, static_cast<int>(learning_rates.size()), step.data<std::int64_t>(),
                             learning_rates.data<float>(), lr.data<float>());
  return lr;
}

Array adam_step_size(const kernels::AdamParams& params, const Array& step, const Array& lr) {
  require_step("adam_step_size", step);
  require_floats("adam_step_size", "lr", lr, step);
  kernels::validate(params);
  const kernels::Backend& be = backend_of("adam_step_size", step.device());
  Array alpha = zeros_on(__func__, lr.shape(), DType::f32, step.device());
  be.optimizer().adam_step_size(params, static_cast<int>(lr.size()), step.data<std::int64_t>(), lr.data<float>(),
                                alpha.data<float>());
  return alpha;
}

Array clip_factor(const std::vector<const Array*>& xs, float max_norm) {
  return clip_factor(xs, max_norm, std::vector<AxisNames>(xs.size()));
}

Array clip_factor(const std::vector<const Array*>& xs, float max_norm, const std::vector<AxisNames>& split) {
  if (xs.empty()) throw ValueError("ops::clip_factor: no arrays to take the norm of");
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    throw ValueError("ops::clip_factor: max_norm must be a positive number, got " + std::to_string(max_norm));
  }
  if (split.size() != xs.size())
    throw ValueError("ops::clip_factor: " + std::to_string(split.size()) + " split axes for " +
                     std::to_string(xs.size()) + " arrays");
  AxisNames over;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    require_dtype("clip_factor", "x", *xs[i], DType::f32);
    require_same_device("clip_factor", *xs[i], "x", *xs.front(), "the first array");
    if (split[i].empty()) continue;
    if (!over.empty() && split[i] != over)
      throw ValueError("ops::clip_factor: arrays split over " + over.str() + " and " + split[i].str() +
                       "; the split ones must share their axes");
    over = split[i];
  }
  const Device device = xs.front()->device();
  const kernels::Backend& be = backend_of("clip_factor", device);
  Array sumsq = zeros_on(__func__, Shape{1}, DType::f64, device);  // zero-filled: every tensor accumulates into it
  for (int pass = over.empty() ? 1 : 0; pass < 2; ++pass) {  // the split blocks (psum'd), then the whole arrays
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (xs[i]->size() == 0 || split[i].empty() != (pass == 1)) continue;
      be.optimizer().sum_squares(1, static_cast<std::size_t>(xs[i]->size()), xs[i]->data<float>(),
                                 sumsq.data<double>(), true);
    }
    if (pass == 0) psum_inplace(sumsq, over);
  }
  Array factor = zeros_on(__func__, Shape{1}, DType::f32, device);
  be.optimizer().clip_factor(1, sumsq.data<double>(), max_norm, factor.data<float>());
  return factor;
}

std::pair<Array, Array> sgd_trace(const kernels::SgdParams& params, const Array& grads, const Array& trace,
                                  const Array& lr) {
  require_dtype("sgd_trace", "grads", grads, DType::f32);
  require_dtype("sgd_trace", "trace", trace, DType::f32);
  require_dtype("sgd_trace", "lr", lr, DType::f32);
  require_same_device("sgd_trace", trace, "trace", grads, "grads");
  require_same_device("sgd_trace", lr, "lr", grads, "grads");
  if (trace.shape() != grads.shape()) {
    throw ShapeError("ops::sgd_trace: trace is " + trace.signature() + " but grads is " + grads.signature() +
                     "; they must have one shape");
  }
  // One rate for every element, or one per row of grads' leading axis (a stacked member's).
  const std::int64_t members = lr.size();
  if (members < 1 || (members > 1 && (grads.ndim() == 0 || grads.dim(0) != members))) {
    throw ShapeError("ops::sgd_trace: lr is " + lr.signature() + " and grads " + grads.signature() +
                     "; lr must be one f32 value, or one per row of grads' leading axis");
  }
  kernels::validate(params);
  const kernels::Backend& be = backend_of("sgd_trace", grads.device());
  std::pair<Array, Array> out{Array::uninitialized(grads.shape(), DType::f32, grads.device()),
                              Array::uninitialized(grads.shape(), DType::f32, grads.device())};
  if (grads.size() > 0) {
    be.optimizer().sgd_trace(params, static_cast<int>(members), static_cast<std::size_t>(grads.size() / members),
                             lr.data<float>(), grads.data<float>(), trace.data<float>(), out.first.data<float>(),
                             out.second.data<float>());
  }
  return out;
}

Array increment(const Array& step) {
  require_step("increment", step);
  const kernels::Backend& be = backend_of("increment", step.device());
  Array next = zeros_on(__func__, Shape{1}, DType::i64, step.device());
  be.copy(next.data<std::int64_t>(), step.data<std::int64_t>(), sizeof(std::int64_t));
  be.optimizer().increment(next.data<std::int64_t>());
  return next;
}

}  // namespace pmap::ops::eager
