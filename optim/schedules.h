// Learning-rate schedules (optax's schedules, the Trainer's formulas): a base rate times
// kernels::schedule_factor of the step counter, evaluated on the device from the optimizer state's (1) i64
// count, so a step never waits for the host and a captured graph replays the right rate.
//
//   optim::Adam tx{.learning_rate = optim::cosine_decay_schedule(1e-3f, {.decay_steps = 1000,
//                                                                        .warmup_steps = 100})};
//   optim::Sgd sgd{.learning_rate = 0.1f};  // a float is a constant schedule
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <pmap/array.h>

#include <pmapcc/kernels/optimizer_ops.h>

namespace pmap::optim {

// A learning rate as a function of the step t (the updates already made): base * schedule_factor(factor, t)
// computed in double and rounded to float once (kernels/optimizer_ops.h): t / warmup_steps during the
// linear warmup from 0, then constant, piecewise, exponential or cosine. A float converts to the constant
// schedule, which gives base bit for bit.
struct Schedule {
  float base = 0.0f;
  kernels::ScheduleParams factor{};
  // Per-member bases (optim/base.h's inject): f32, one per member stacked on the leaves' leading axis, on the
  // parameters' device; when set they replace base on the device (the rate at t is then one per member, each
  // the bits base = that value gives). at() reads base only. Copies of the schedule share them.
  std::shared_ptr<const Array> bases = nullptr;

  Schedule() = default;
  Schedule(float learning_rate) : base(learning_rate) {}  // NOLINT(google-explicit-constructor): a rate
  Schedule(float learning_rate, const kernels::ScheduleParams& params) : base(learning_rate), factor(params) {}

  // The rate at step t, on the host, with the same bits as the device's (for logs and tests).
  float at(std::int64_t step) const;
};

// The base rate, after warmup_steps of linear warmup from 0 (optax.constant_schedule without warmup).
Schedule constant_schedule(float value, std::int64_t warmup_steps = 0);

// value * factors[i] from step boundaries[i] on (after the warmup; value before the first boundary).
// boundaries increasing and >= 0, factors finite and >= 0, at most kernels::kMaxScheduleBoundaries of them.
// Unlike optax.piecewise_constant_schedule, factors replace each other (they do not multiply).
struct PiecewiseOptions {
  std::vector<std::int64_t> boundaries;
  std::vector<double> factors;
  std::int64_t warmup_steps = 0;
};
Schedule piecewise_schedule(float value, const PiecewiseOptions& options);

// value * decay_rate ^ (s / transition_steps), s the steps after the warmup (floor of the ratio with
// staircase): optax.exponential_decay with a linear warmup before it.
struct ExponentialDecayOptions {
  std::int64_t transition_steps = 1;  // >= 1
  double decay_rate = 1.0;            // > 0
  bool staircase = false;
  std::int64_t warmup_steps = 0;
};
Schedule exponential_decay_schedule(float value, const ExponentialDecayOptions& options);

// value * (alpha + (1 - alpha) * (1 + cos(pi * min(s, decay_steps) / decay_steps)) / 2), s the steps after
// the warmup: optax.cosine_decay_schedule (optax.warmup_cosine_decay_schedule from 0 with warmup_steps).
struct CosineDecayOptions {
  std::int64_t decay_steps = 1;  // >= 1: the decay's length after the warmup
  double alpha = 0.0;            // in [0, 1]: the final factor
  std::int64_t warmup_steps = 0;
};
Schedule cosine_decay_schedule(float value, const CosineDecayOptions& options);

namespace detail {
// ValueError "<who>: <field> ..." when the schedule cannot be run: base negative or not finite, or a
// factor parameter out of range (warmup_steps, decay_steps, decay_rate, alpha, boundaries, factors).
void check_schedule(const char* who, const char* field, const Schedule& s);
// The rate at step *count, (1) f32 on count's device, computed there (ops::eager::schedule_lr); with
// per-member bases, one rate per member in the bases' shape.
Array learning_rate_at(const Schedule& s, const Array& count);
}  // namespace detail

}  // namespace pmap::optim
