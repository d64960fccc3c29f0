// CUDA element-wise ops (ElementwiseOps) and the per-member sums (LossOps' reductions), one item
// per element (per member for the sums). No FMA contraction (-fmad=false): bitwise the CPU ops' results.
#include <pmap/error.h>

#include <cmath>
#include <string>

#include <pmapcc/kernels/cuda/backend.h>
#include <pmapcc/kernels/elementwise_math.h>

namespace pmap::kernels::gpu {
namespace {

template <UnaryOp Op> struct Unary {
  const float* x;
  float* y;
  PMAPCC_HD void operator()(std::size_t i) const { y[i] = unary_value<Op>(x[i]); }
};

template <UnaryOp Op> struct ActivationBackward {
  const float* y;
  const float* dy;
  float* dx;
  PMAPCC_HD void operator()(std::size_t i) const { dx[i] = activation_grad_value<Op>(y[i], dy[i]); }
};

template <BinaryOp Op> struct Binary {
  const float* a;
  const float* b;
  std::size_t nb;
  float* y;
  PMAPCC_HD void operator()(std::size_t i) const { y[i] = binary_value<Op>(a[i], b[i % nb]); }
};

// Per member: its n values summed in double in index order (the CPU's order), divided, rounded once.
struct MemberSums {
  std::size_t n;
  const float* x;
  float* out;
  double divisor;
  PMAPCC_HD void operator()(std::size_t m) const {
    double acc = 0.0;
    for (std::size_t i = m * n; i < (m + 1) * n; ++i) acc += x[i];
    out[m] = static_cast<float>(divisor == 1.0 ? acc : acc / divisor);
  }
};

void member_sums(const Exec& ex, const char* op, int members, std::size_t n, const float* x, float* out,
                 double divisor) {
  require(x, op, "x");
  require(out, op, "out");
  if (members <= 0) throw ValueError(std::string(op) + ": members must be > 0 (got " + std::to_string(members) + ")");
  ex.launch(MemberSums{n, x, out, divisor}, static_cast<std::size_t>(members));
}

}  // namespace

void CudaElementwiseOps::unary(UnaryOp op, std::size_t n, const float* x, float* y) const {
  check_unary(to_string(op), n, x, y);
  if (n == 0) return;
  dispatch_unary(op, [&]<UnaryOp Op>() { ex_.launch(Unary<Op>{x, y}, n); });
}

void CudaElementwiseOps::activation_backward(UnaryOp op, std::size_t n, const float* y, const float* dy,
                                             float* dx) const {
  check_activation_backward(op, n, y, dy, dx);
  if (n == 0) return;
  switch (op) {
    case UnaryOp::relu: ex_.launch(ActivationBackward<UnaryOp::relu>{y, dy, dx}, n); return;
    case UnaryOp::sigmoid: ex_.launch(ActivationBackward<UnaryOp::sigmoid>{y, dy, dx}, n); return;
    case UnaryOp::tanh: ex_.launch(ActivationBackward<UnaryOp::tanh>{y, dy, dx}, n); return;
    default: ex_.launch(ActivationBackward<UnaryOp::exp>{y, dy, dx}, n); return;  // what the check lets by last
  }
}

void CudaElementwiseOps::binary(BinaryOp op, std::size_t n, const float* a, std::size_t nb, const float* b,
                                float* y) const {
  check_binary(op, n, a, nb, b, y);
  if (n == 0) return;
  dispatch_binary(op, [&]<BinaryOp Op>() { ex_.launch(Binary<Op>{a, b, nb, y}, n); });
}

void CudaLossOps::reduce_sum(int members, std::size_t n, const float* x, float* out) const {
  const Exec& ex = ex_;
  member_sums(ex, "reduce_sum", members, n, x, out, 1.0);
}

void CudaLossOps::reduce_mean(int members, std::size_t n, const float* x, float* out) const {
  const Exec& ex = ex_;
  if (n == 0) throw ValueError("reduce_mean: n must be > 0");
  member_sums(ex, "reduce_mean", members, n, x, out, static_cast<double>(n));
}

}  // namespace pmap::kernels::gpu
