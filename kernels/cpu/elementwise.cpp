// CPU element-wise ops and reductions: relu forward/backward, per-member sums.
#include <pmap/error.h>

#include <cmath>
#include <string>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/ops.h>

namespace PMAPCC_CPU_NS {

void LayerOpsImpl::relu_forward(std::size_t n, const float* x, float* y) const {
  detail::require(x, "relu_forward", "x");
  detail::require(y, "relu_forward", "y");
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN is not < 0: it passes
}

void LayerOpsImpl::relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const {
  detail::require(y, "relu_backward", "y");
  detail::require(dy, "relu_backward", "dy");
  detail::require(dx, "relu_backward", "dx");
  for (std::size_t i = 0; i < n; ++i) {
    const float g = dy[i];  // loaded unconditionally, so the select compiles to a vector mask, not a branch
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
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
