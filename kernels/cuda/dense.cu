// CUDA dense layer forward and backward: strided-batched GEMMs over members (a shared input has batch
// stride 0), the bias-and-ReLU epilogue, and deterministic bias-gradient column sums. bf16: each GEMM's
// operands are rounded into the workspace first (see Gemm in exec.h).
#include <algorithm>

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

Gemm member_gemm(const DenseParams& p) {
  Gemm g;
  g.bf16 = p.precision == Precision::bf16;
  return g;
}

Gemm forward_gemm(const DenseParams& p) {  // y_m (N, O) = x_m (N, I) @ w_m (I, O)
  const DenseSizes s = sizes(p);
  Gemm g = member_gemm(p);
  g.m = p.batch, g.n = p.out_features, g.k = p.in_features;
  g.stride_a = s.x, g.stride_b = s.w, g.stride_c = s.y, g.batch = p.members;
  return g;
}

Gemm dw_gemm(const DenseParams& p) {  // dw_m (I, O) = x_m^T (I, N) @ dy_m (N, O)
  const DenseSizes s = sizes(p);
  Gemm g = member_gemm(p);
  g.trans_a = true;
  g.m = p.in_features, g.n = p.out_features, g.k = p.batch;
  g.stride_a = s.x, g.stride_b = s.y, g.stride_c = s.w, g.batch = p.members;
  return g;
}

// dx_m (N, I) = dy_m (N, O) @ w_m^T, batched over members; with a shared input, one member's GEMM, called
// per member with the sums accumulated in C.
Gemm dx_gemm(const DenseParams& p) {
  const DenseSizes s = sizes(p);
  Gemm g = member_gemm(p);
  g.trans_b = true;
  g.m = p.batch, g.n = p.in_features, g.k = p.out_features;
  if (p.shared_input) return g;
  g.stride_a = s.y, g.stride_b = s.w, g.stride_c = static_cast<long long>(p.batch) * p.in_features;
  g.batch = p.members;
  return g;
}

std::size_t partial_bytes(const DenseParams& p) {
  const std::size_t n = column_sum_partials(p.members, static_cast<std::size_t>(p.batch), p.out_features);
  return n == 0 ? 0 : align_up(n * sizeof(double));
}

std::size_t bf16_bytes(const DenseParams& p) {
  return std::max({bf16_operand_bytes(forward_gemm(p)), bf16_operand_bytes(dw_gemm(p)),
                   bf16_operand_bytes(dx_gemm(p))});
}

// The workspace's bf16 operand space (after the bias partial sums), or scratch memory without a workspace.
void* bf16_space(const Exec& ex, const DenseParams& p, void* workspace) {
  const std::size_t bytes = bf16_bytes(p);
  if (bytes == 0) return nullptr;
  if (workspace == nullptr) return ex.scratch(bytes);
  return static_cast<unsigned char*>(workspace) + partial_bytes(p);
}

}  // namespace

std::size_t CudaDenseOps::dense_workspace_bytes(DenseParams p) const {
  validate(p);
  return partial_bytes(p) + bf16_bytes(p);
}

void CudaDenseOps::dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y,
                                 void* workspace) const {
  const Exec& ex = ex_;
  require(x, "dense_forward", "x");
  require(w, "dense_forward", "w");
  require(y, "dense_forward", "y");
  validate(p);
  product(ex, forward_gemm(p), x, w, y, bf16_space(ex, p, workspace));
  bias_relu(ex, p.members, static_cast<std::size_t>(p.batch), p.out_features, b, p.relu, y);
}

void CudaDenseOps::dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                                 float* db, void* workspace) const {
  const Exec& ex = ex_;
  require(dy, "dense_backward", "dy");
  if (dw != nullptr) require(x, "dense_backward", "x (needed for dw)");
  if (dx != nullptr) require(w, "dense_backward", "w (needed for dx)");
  validate(p);
  const DenseSizes s = sizes(p);
  if (db != nullptr) {
    auto* partial = partial_bytes(p) == 0 ? nullptr : static_cast<double*>(workspace);
    column_sums(ex, p.members, static_cast<std::size_t>(p.batch), p.out_features, dy, db, partial);
  }
  void* bf16 = dw != nullptr || dx != nullptr ? bf16_space(ex, p, workspace) : nullptr;
  if (dw != nullptr) product(ex, dw_gemm(p), x, dy, dw, bf16);
  if (dx == nullptr) return;
  Gemm g = dx_gemm(p);
  if (p.shared_input) {  // one dx summed over members, in member order
    for (int m = 0; m < p.members; ++m) {
      g.beta = m == 0 ? 0.0f : 1.0f;
      product(ex, g, dy + m * s.y, w + m * s.w, dx, bf16);
    }
    return;
  }
  product(ex, g, dy, w, dx, bf16);
}

}  // namespace pmap::kernels::gpu
