// The arithmetic of ElementwiseOps (kernels/elementwise_ops.h), shared by the CPU ops and the CUDA kernels
// (PMAPCC_HD) so both give the same bits on the host: one function per element. Compiled without FMA
// contraction on both sides.
#pragma once

#include <math.h>  // expf, logf, tanhf, sqrtf: glibc on the host, CUDA's on the device

#include <pmap/detail/launch.h>

#include <pmapcc/kernels/elementwise_ops.h>

namespace pmap::kernels {

template <UnaryOp Op> PMAPCC_HD inline float unary_value(float x) {
  if constexpr (Op == UnaryOp::negative) return -x;
  if constexpr (Op == UnaryOp::abs) return fabsf(x);
  if constexpr (Op == UnaryOp::square) return x * x;
  if constexpr (Op == UnaryOp::sqrt) return sqrtf(x);
  if constexpr (Op == UnaryOp::exp) return expf(x);
  if constexpr (Op == UnaryOp::log) return logf(x);
  if constexpr (Op == UnaryOp::relu) return x < 0.0f ? 0.0f : x;  // NaN is not < 0: it passes
  if constexpr (Op == UnaryOp::sigmoid) return 1.0f / (1.0f + expf(-x));  // 0 for x -> -inf, 1 for +inf
  if constexpr (Op == UnaryOp::tanh) return tanhf(x);
}

// dx from the activation's output y and the output gradient dy; only the ops activation_backward takes.
template <UnaryOp Op> PMAPCC_HD inline float activation_grad_value(float y, float dy) {
  if constexpr (Op == UnaryOp::relu) return y > 0.0f ? dy : 0.0f;
  if constexpr (Op == UnaryOp::sigmoid) return dy * (y * (1.0f - y));
  if constexpr (Op == UnaryOp::tanh) return dy * (1.0f - y * y);
  if constexpr (Op == UnaryOp::exp) return dy * y;
}

template <BinaryOp Op> PMAPCC_HD inline float binary_value(float a, float b) {
  if constexpr (Op == BinaryOp::add) return a + b;
  if constexpr (Op == BinaryOp::subtract) return a - b;
  if constexpr (Op == BinaryOp::multiply) return a * b;
  if constexpr (Op == BinaryOp::divide) return a / b;
  if constexpr (Op == BinaryOp::maximum) return (a != a || a > b) ? a : b;  // b when b is NaN (a > NaN fails)
  if constexpr (Op == BinaryOp::minimum) return (a != a || a < b) ? a : b;
}

// Calls f.operator()<op>(): one instantiation per op, so each loop or kernel has a fixed body.
template <class F> inline void dispatch_unary(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::negative: f.template operator()<UnaryOp::negative>(); return;
    case UnaryOp::abs: f.template operator()<UnaryOp::abs>(); return;
    case UnaryOp::square: f.template operator()<UnaryOp::square>(); return;
    case UnaryOp::sqrt: f.template operator()<UnaryOp::sqrt>(); return;
    case UnaryOp::exp: f.template operator()<UnaryOp::exp>(); return;
    case UnaryOp::log: f.template operator()<UnaryOp::log>(); return;
    case UnaryOp::relu: f.template operator()<UnaryOp::relu>(); return;
    case UnaryOp::sigmoid: f.template operator()<UnaryOp::sigmoid>(); return;
    case UnaryOp::tanh: f.template operator()<UnaryOp::tanh>(); return;
  }
}

template <class F> inline void dispatch_binary(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add: f.template operator()<BinaryOp::add>(); return;
    case BinaryOp::subtract: f.template operator()<BinaryOp::subtract>(); return;
    case BinaryOp::multiply: f.template operator()<BinaryOp::multiply>(); return;
    case BinaryOp::divide: f.template operator()<BinaryOp::divide>(); return;
    case BinaryOp::maximum: f.template operator()<BinaryOp::maximum>(); return;
    case BinaryOp::minimum: f.template operator()<BinaryOp::minimum>(); return;
  }
}

// Whether activation_backward takes `op`.
inline bool has_activation_grad(UnaryOp op) {
  return op == UnaryOp::relu || op == UnaryOp::sigmoid || op == UnaryOp::tanh || op == UnaryOp::exp;
}

// The checks every implementation makes before it computes, raising ValueError naming the op and argument.
void check_unary(const char* what, std::size_t n, const float* x, const float* y);
void check_activation_backward(UnaryOp op, std::size_t n, const float* y, const float* dy, const float* dx);
void check_binary(BinaryOp op, std::size_t n, const float* a, std::size_t nb, const float* b, const float* y);

}  // namespace pmap::kernels
