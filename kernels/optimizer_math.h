// The per-element arithmetic of the optimizer updates (kernels/optimizer_ops.h), written once for the CPU
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

// One member's scalars for an SGD update.
struct SgdMember {
  float lr, momentum, weight_decay, grad_scale;
  bool nesterov, decay, scale;
};

PMAPCC_HD inline SgdMember sgd_member(const SgdParams& p, const UpdateScalars& s, int m) {
  return SgdMember{s.lr[m],
                   p.momentum,
                   s.weight_decay ? s.weight_decay[m] : 0.0f,
                   s.grad_scale ? s.grad_scale[m] : 1.0f,
                   p.nesterov,
                   s.weight_decay != nullptr,
                   s.grad_scale != nullptr};
}

// Decoupled weight decay as Keras applies it, before the update: p <- p - p * wd * lr.
PMAPCC_HD inline void decay(float& p, float weight_decay, float lr) { p -= p * weight_decay * lr; }

PMAPCC_HD inline void sgd_element(const SgdMember& k, float& p, float& m, float g) {
  if (k.scale) g *= k.grad_scale;
  if (k.decay) decay(p, k.weight_decay, k.lr);
  m = k.momentum * m + g;
  p -= k.nesterov ? k.lr * (g + k.momentum * m) : k.lr * m;
}

// optax.sgd's trace and update of one element (OptimizerOps::sgd_trace): sgd_element's arithmetic, with the
// update kept apart from the parameter, so p + u equals sgd_element's p - lr * ... exactly.
PMAPCC_HD inline void sgd_trace_element(const SgdParams& p, float lr, float g, float m, float& next, float& u) {
  next = p.momentum * m + g;
  u = -(p.nesterov ? lr * (g + p.momentum * next) : lr * next);
}

// One member's scalars for an Adam update; one_minus_beta_* are 1 - beta computed in double.
struct AdamMember {
  float lr, alpha, one_minus_beta_1, one_minus_beta_2, epsilon, weight_decay, grad_scale;
  bool decay, scale;
};

PMAPCC_HD inline AdamMember adam_member(const AdamParams& p, const UpdateScalars& s, const float* alpha, int m) {
  return AdamMember{s.lr[m],
                    alpha[m],
                    static_cast<float>(1.0 - p.beta_1),
                    static_cast<float>(1.0 - p.beta_2),
                    p.epsilon,
                    s.weight_decay ? s.weight_decay[m] : 0.0f,
                    s.grad_scale ? s.grad_scale[m] : 1.0f,
                    s.weight_decay != nullptr,
                    s.grad_scale != nullptr};
}

// Keras's order: m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2); p -= (m alpha) / (sqrt(v) + epsilon).
PMAPCC_HD inline void adam_element(const AdamMember& k, float& p, float& m, float& v, float g) {
  if (k.scale) g *= k.grad_scale;
  if (k.decay) decay(p, k.weight_decay, k.lr);
  m += (g - m) * k.one_minus_beta_1;
  v += (g * g - v) * k.one_minus_beta_2;
  p -= (m * k.alpha) / (sqrtf(v) + k.epsilon);
}

}  // namespace pmap::kernels
