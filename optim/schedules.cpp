// The schedules' constructors and checks (optim/schedules.h); the factor itself is the kernels'.
#include <pmapcc/optim/schedules.h>

#include <cmath>
#include <string>

#include <pmap/error.h>

#include <pmapcc/kernels/eager/array_ops_optim.h>

namespace pmap::optim {
namespace {

[[noreturn]] void bad(const char* who, const char* field, const std::string& what) {
  throw ValueError(std::string(who) + ": " + field + " " + what);
}

void check_params(const char* who, const char* field, const kernels::ScheduleParams& p) {
  const std::string f = std::string(field).empty() ? "" : std::string(field) + "'s ";
  auto fail = [&](const char* name, const std::string& what) { bad(who, (f + name).c_str(), what); };
  if (p.warmup_steps < 0) fail("warmup_steps", "must be >= 0, got " + std::to_string(p.warmup_steps));
  if (p.decay_steps < 1) fail("decay_steps", "must be >= 1, got " + std::to_string(p.decay_steps));
  if (!(p.decay_rate > 0) || !std::isfinite(p.decay_rate))
    fail("decay_rate", "must be a positive number, got " + std::to_string(p.decay_rate));
  if (!(p.alpha >= 0 && p.alpha <= 1)) fail("alpha", "must be in [0, 1], got " + std::to_string(p.alpha));
  if (p.boundaries_count < 0 || p.boundaries_count > kernels::kMaxScheduleBoundaries)
    fail("boundaries", "must be at most " + std::to_string(kernels::kMaxScheduleBoundaries) + ", got " +
                           std::to_string(p.boundaries_count));
  for (int i = 0; i < p.boundaries_count; ++i) {
    if (p.boundaries[i] < 0 || (i > 0 && p.boundaries[i] <= p.boundaries[i - 1]))
      fail("boundaries", "must be increasing and >= 0 (boundary " + std::to_string(i) + " is " +
                             std::to_string(p.boundaries[i]) + ")");
    if (!(p.values[i] >= 0) || !std::isfinite(p.values[i]))
      fail("factors", "must be finite and >= 0 (factor " + std::to_string(i) + " is " + std::to_string(p.values[i]) + ")");
  }
}

Schedule made(const char* who, float value, const kernels::ScheduleParams& p) {
  Schedule s(value, p);
  if (!(value >= 0) || !std::isfinite(value)) bad(who, "value", "must be finite and >= 0, got " + std::to_string(value));
  check_params(who, "", p);
  return s;
}

}  // namespace

float Schedule::at(std::int64_t step) const {
  const double f = kernels::schedule_factor(factor, step);
  return f == 1.0 ? base : static_cast<float>(static_cast<double>(base) * f);
}

Schedule constant_schedule(float value, std::int64_t warmup_steps) {
  kernels::ScheduleParams p;
  p.warmup_steps = warmup_steps;
  return made("optim::constant_schedule", value, p);
}

Schedule piecewise_schedule(float value, const PiecewiseOptions& o) {
  const char* who = "optim::piecewise_schedule";
  if (o.boundaries.size() != o.factors.size()) {
    bad(who, "factors", "must be as many as the boundaries (" + std::to_string(o.boundaries.size()) + "), got " +
                            std::to_string(o.factors.size()));
  }
  if (o.boundaries.size() > static_cast<std::size_t>(kernels::kMaxScheduleBoundaries)) {
    bad(who, "boundaries", "must be at most " + std::to_string(kernels::kMaxScheduleBoundaries) + ", got " +
                               std::to_string(o.boundaries.size()));
  }
  kernels::ScheduleParams p;
  p.kind = kernels::ScheduleKind::piecewise;
  p.warmup_steps = o.warmup_steps;
  p.boundaries_count = static_cast<int>(o.boundaries.size());
  for (std::size_t i = 0; i < o.boundaries.size(); ++i) {
    p.boundaries[i] = o.boundaries[i];
    p.values[i] = o.factors[i];
  }
  return made(who, value, p);
}

Schedule exponential_decay_schedule(float value, const ExponentialDecayOptions& o) {
  kernels::ScheduleParams p;
  p.kind = kernels::ScheduleKind::exponential;
  p.warmup_steps = o.warmup_steps;
  p.decay_steps = o.transition_steps;
  p.decay_rate = o.decay_rate;
  p.staircase = o.staircase;
  if (o.transition_steps < 1) {
    bad("optim::exponential_decay_schedule", "transition_steps",
        "must be >= 1, got " + std::to_string(o.transition_steps));
  }
  return made("optim::exponential_decay_schedule", value, p);
}

Schedule cosine_decay_schedule(float value, const CosineDecayOptions& o) {
  kernels::ScheduleParams p;
  p.kind = kernels::ScheduleKind::cosine;
  p.warmup_steps = o.warmup_steps;
  p.decay_steps = o.decay_steps;
  p.alpha = o.alpha;
  return made("optim::cosine_decay_schedule", value, p);
}

namespace detail {

void check_schedule(const char* who, const char* field, const Schedule& s) {
  if (!(s.base >= 0) || !std::isfinite(s.base)) {
    bad(who, field, "must be finite and >= 0, got " + std::to_string(s.base));
  }
  check_params(who, field, s.factor);
}

Array learning_rate_at(const Schedule& s, const Array& count) {
  return s.bases ? ops::eager::schedule_lr(s.factor, *s.bases, count)
                 : ops::eager::schedule_lr(s.factor, s.base, count);
}

}  // namespace detail
}  // namespace pmap::optim
