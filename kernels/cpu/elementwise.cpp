// CPU element-wise ops and reductions: ElementwiseOps and LossOps' per-member sums.
#include <pmap/error.h>

#include <cmath>
#include <string>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/elementwise_math.h>
#include <pmapcc/kernels/ops.h>

namespace PMAPCC_CPU_NS {

void ElementwiseOpsImpl::unary(UnaryOp op, std::size_t n, const float* x, float* y) const {
  check_unary(to_string(op), n, x, y);
  dispatch_unary(op, [&]<UnaryOp Op>() {
    for (std::size_t i = 0; i < n; ++i) y[i] = unary_value<Op>(x[i]);
  });
}

void ElementwiseOpsImpl::activation_backward(UnaryOp op, std::size_t n, const float* y, const float* dy,
                                             float* dx) const {
  check_activation_backward(op, n, y, dy, dx);
  auto run = [&]<UnaryOp Op>() {
    for (std::size_t i = 0; i < n; ++i) dx[i] = activation_grad_value<Op>(y[i], dy[i]);
  };
  switch (op) {
    case UnaryOp::relu: run.template operator()<UnaryOp::relu>(); return;
    case UnaryOp::sigmoid: run.template operator()<UnaryOp::sigmoid>(); return;
    case UnaryOp::tanh: run.template operator()<UnaryOp::tanh>(); return;
    default: run.template operator()<UnaryOp::exp>(); return;  // the last one check_activation_backward lets by
  }
}

void ElementwiseOpsImpl::binary(BinaryOp op, std::size_t n, const float* a, std::size_t nb, const float* b,
                                float* y) const {
  check_binary(op, n, a, nb, b, y);
  if (n == 0) return;
  dispatch_binary(op, [&]<BinaryOp Op>() {
    if (nb == n) {
      for (std::size_t i = 0; i < n; ++i) y[i] = binary_value<Op>(a[i], b[i]);
    } else if (nb == 1) {
      const float s = b[0];
      for (std::size_t i = 0; i < n; ++i) y[i] = binary_value<Op>(a[i], s);
    } else {  // rows of nb: the inner loop is contiguous in a, b and y
      for (std::size_t r = 0; r < n; r += nb) {
        for (std::size_t j = 0; j < nb; ++j) y[r + j] = binary_value<Op>(a[r + j], b[j]);
      }
    }
  });
}

namespace {

// Sum of each member's n values in double, in index order; calls store(m, sum).
template <class Store>
void member_sums(const char* op, int members, std::size_t n, const float* x, const float* out, Store store) {
  detail::require(x, op, "x");
  detail::require(out, op, "out");
  if (members <= 0) {
    throw ValueError(std::string(op) + ": members must be > 0 (got " + std::to_string(members) + ")");
  }
  for (int m = 0; m < members; ++m) {
    const float* xm = x + static_cast<std::size_t>(m) * n;
    double acc = 0.0;
    for (std::size_t i = 0; i < n; ++i) acc += xm[i];
    store(m, acc);
  }
}

}  // namespace

void LossOpsImpl::reduce_sum(int members, std::size_t n, const float* x, float* out) const {
  member_sums("reduce_sum", members, n, x, out, [&](int m, double sum) { out[m] = static_cast<float>(sum); });
}

void LossOpsImpl::reduce_mean(int members, std::size_t n, const float* x, float* out) const {
  if (n == 0) throw ValueError("reduce_mean: n must be > 0");
  member_sums("reduce_mean", members, n, x, out,
              [&](int m, double sum) { out[m] = static_cast<float>(sum / static_cast<double>(n)); });
}

}  // namespace PMAPCC_CPU_NS
