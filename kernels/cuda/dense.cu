// CUDA dense layer forward and backward: strided-batched GEMMs over members (a shared input has batch
// stride 0), the bias-and-ReLU epilogue, and deterministic bias-gradient column sums.
#include <pmapcc/kernels/cuda/backend.h>
#include <pmapcc/kernels/cuda/linear.h>

namespace pmap::kernels::gpu {
namespace {

struct DenseSizes {
  long long x, w, y;  // elements per member of x, w and y
};

DenseSizes sizes(const DenseParams& p) {
  const long long n = p.batch, in = p.in_features, out = p.out_features;
  return DenseSizes{p.shared_input ? 0 : n * in, in * out, n * out};
}

}  // namespace

std::size_t CudaDenseOps::dense_workspace_bytes(DenseParams p) const {
  validate(p);
  require_fp32(p.precision, "dense");
  return column_sum_partials(p.members, static_cast<std::size_t>(p.batch), p.out_features) * sizeof(double);
}

void CudaDenseOps::dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y, void*) const {
  const Exec& ex = ex_;
  require(x, "dense_forward", "x");
  require(w, "dense_forward", "w");
  require(y, "dense_forward", "y");
  validate(p);
  require_fp32(p.precision, "dense_forward");
  const DenseSizes s = sizes(p);
  Gemm g;  // y_m (N, O) = x_m (N, I) @ w_m (I, O)
  g.m = p.batch, g.n = p.out_features, g.k = p.in_features;
  g.stride_a = s.x, g.stride_b = s.w, g.stride_c = s.y, g.batch = p.members;
  ex.gemm(g, x, w, y);
  bias_relu(ex, p.members, static_cast<std::size_t>(p.batch), p.out_features, b, p.relu, y);
}

void CudaDenseOps::dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                                 float* db, void* workspace) const {
  const Exec& ex = ex_;
  require(dy, "dense_backward", "dy");
  if (dw != nullptr) require(x, "dense_backward", "x (needed for dw)");
  if (dx != nullptr) require(w, "dense_backward", "w (needed for dx)");
  validate(p);
  require_fp32(p.precision, "dense_backward");
  const DenseSizes s = sizes(p);
  if (db != nullptr) {
    auto* partial = dense_workspace_bytes(p) == 0 ? nullptr : static_cast<double*>(workspace);
    column_sums(ex, p.members, static_cast<std::size_t>(p.batch), p.out_features, dy, db, partial);
  }
  if (dw != nullptr) {  // dw_m (I, O) = x_m^T (I, N) @ dy_m (N, O)
    Gemm g;
    g.trans_a = true;
    g.m = p.in_features, g.n = p.out_features, g.k = p.batch;
    g.stride_a = s.x, g.stride_b = s.y, g.stride_c = s.w, g.batch = p.members;
    ex.gemm(g, x, dy, dw);
  }
  if (dx == nullptr) return;
  Gemm g;  // dx_m (N, I) = dy_m (N, O) @ w_m^T
  g.trans_b = true;
  g.m = p.batch, g.n = p.in_features, g.k = p.out_features;
  if (p.shared_input) {  // one dx summed over members, in member order
    for (int m = 0; m < p.members; ++m) {
      g.beta = m == 0 ? 0.0f : 1.0f;
      ex.gemm(g, dy + m * s.y, w + m * s.w, dx);
    }
    return;
  }
  g.stride_a = s.y, g.stride_b = s.w, g.stride_c = static_cast<long long>(p.batch) * p.in_features;
  g.batch = p.members;
  ex.gemm(g, dy, w, dx);
}

}  // namespace pmap::kernels::gpu
