// The per-element arithmetic of the optimizer ops (kernels/optimizer_ops.h), written once for the CPU
// ops and the CUDA kernels (PMAPCC_HD) so both give the same bits; the tests check it against the
// formulas computed independently.
#pragma once

#include <math.h>  // sqrt: glibc on the host, CUDA's (correctly rounded) on the device

#include <cstddef>

#include <pmap/detail/launch.h>

#include <pmapcc/kernels/optimizer_ops.h>

namespace pmap::kernels {

// optax clip_by_global_norm's factor: 1 when the norm is within max_norm, else max_norm / norm, computed in
// double and applied as g * factor (optax computes (g / norm) * max_norm in float: the same up to rounding).
PMAPCC_HD inline float clip_scale(double sumsq, float max_norm) {
  const double norm = sqrt(sumsq);
  return norm <= static_cast<double>(max_norm) ? 1.0f : static_cast<float>(static_cast<double>(max_norm) / norm);
}

// optax.sgd's trace and update of one element (OptimizerOps::sgd_trace), kept apart from the parameter.
PMAPCC_HD inline void sgd_trace_element(const SgdParams& p, float lr, float g, float m, float& next, float& u) {
  next = p.momentum * m + g;
  u = -(p.nesterov ? lr * (g + p.momentum * next) : lr * next);
}

}  // namespace pmap::kernels
