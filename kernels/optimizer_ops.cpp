// The optimizer ops' parameter checks, shared by the CPU and CUDA implementations.
#include <pmapcc/kernels/optimizer_ops.h>

#include <cmath>
#include <string>

#include <pmap/error.h>

namespace pmap::kernels {

void validate(const ScheduleParams& p) {
  auto bad = [](const std::string& m) { throw ValueError("ScheduleParams: " + m); };
  if (p.warmup_steps < 0) bad("warmup_steps must be >= 0, got " + std::to_string(p.warmup_steps));
  if (p.decay_steps < 1) bad("decay_steps must be >= 1, got " + std::to_string(p.decay_steps));
  if (!(p.decay_rate > 0) || !std::isfinite(p.decay_rate)) bad("decay_rate must be a positive number");
  if (!(p.alpha >= 0 && p.alpha <= 1)) bad("alpha must be in [0, 1]");
  if (p.boundaries_count < 0 || p.boundaries_count > kMaxScheduleBoundaries)
    bad("boundaries_count must be in 0.." + std::to_string(kMaxScheduleBoundaries));
  for (int i = 0; i < p.boundaries_count; ++i) {
    if (p.boundaries[i] < 0 || (i > 0 && p.boundaries[i] <= p.boundaries[i - 1]))
      bad("boundaries must be increasing and >= 0");
    if (!(p.values[i] >= 0) || !std::isfinite(p.values[i])) bad("values must be finite and >= 0");
  }
}

void validate(const SgdParams& p) {
  if (!(p.momentum >= 0) || !std::isfinite(p.momentum)) throw ValueError("SgdParams: momentum must be finite and >= 0");
}

void validate(const AdamParams& p) {
  if (!(p.beta_1 >= 0 && p.beta_1 < 1)) throw ValueError("AdamParams: beta_1 must be in [0, 1)");
  if (!(p.beta_2 >= 0 && p.beta_2 < 1)) throw ValueError("AdamParams: beta_2 must be in [0, 1)");
  if (!(p.epsilon > 0) || !std::isfinite(p.epsilon)) throw ValueError("AdamParams: epsilon must be a positive number");
}

}  // namespace pmap::kernels
