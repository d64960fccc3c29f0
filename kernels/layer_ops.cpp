// The layer ops' parameter checks, shared by the CPU and CUDA implementations.
#include <pmapcc/kernels/layer_ops.h>

#include <cmath>
#include <string>

#include <pmap/error.h>

namespace pmap::kernels {

void validate(const BatchNormParams& p) {
  auto bad = [](const std::string& m) { throw ValueError("BatchNormParams: " + m); };
  if (p.members < 1 || p.rows < 1 || p.channels < 1) bad("members, rows and channels must be >= 1");
  if (!(p.epsilon > 0) || !std::isfinite(p.epsilon)) bad("epsilon must be a positive number");
  if (!(p.momentum >= 0 && p.momentum <= 1)) bad("momentum must be in [0, 1]");
}

void validate(const DropoutParams& p) {
  auto bad = [](const std::string& m) { throw ValueError("DropoutParams: " + m); };
  if (p.members < 1 || p.rows < 1 || p.features < 1) bad("members, rows and features must be >= 1");
  if (!(p.rate >= 0 && p.rate < 1)) bad("rate must be in [0, 1), got " + std::to_string(p.rate));
  if (p.example_offset < 0 || p.feature_offset < 0) bad("example_offset and feature_offset must be >= 0");
}

}  // namespace pmap::kernels
