// CPU dense layer forward and backward: one GEMM per member (x @ W + b) on row-major buffers.
#include <algorithm>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/cpu/gemm.h>
#include <pmapcc/kernels/ops.h>

namespace PMAPCC_CPU_NS {
namespace {

using detail::GemmOperand;
using detail::Index;

// Validates p, then sizes the packing space of its three GEMMs.
std::size_t pack_floats(const DenseParams& p) {
  validate(p);
  detail::require_precision(p.precision, "dense");
  const Index n = p.batch, in = p.in_features, out = p.out_features;
  return std::max({detail::gemm_pack_floats(n, out, in, p.precision),    // y = x @ w
                   detail::gemm_pack_floats(in, out, n, p.precision),    // dw = x^T @ dy
                   detail::gemm_pack_floats(n, in, out, p.precision)});  // dx = dy @ w^T
}

}  // namespace

std::size_t DenseOpsImpl::dense_workspace_bytes(DenseParams p) const {
  return pack_floats(p) * sizeof(float) + detail::Scratch::kAlign;
}

void DenseOpsImpl::dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y,
                        void* workspace) const {
  detail::require(x, "dense_forward", "x");
  detail::require(w, "dense_forward", "w");
  detail::require(y, "dense_forward", "y");
  const std::size_t pack_size = pack_floats(p);
  detail::Workspace space(workspace, dense_workspace_bytes(p));
  float* pack = detail::Scratch(space.get()).take(pack_size);
  const Index n = p.batch, in = p.in_features, out = p.out_features;
  for (int m = 0; m < p.members; ++m) {
    float* ym = y + m * n * out;
    const float* xm = x + (p.shared_input ? 0 : m * n * in);
    detail::fill_rows(b == nullptr ? nullptr : b + m * out, n, out, ym);
    detail::gemm(n, out, in, {xm}, {w + m * in * out}, ym, true, pack, pack_size, p.precision);
    if (p.relu) detail::relu_in_place(ym, n * out);
  }
}

void DenseOpsImpl::dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                         float* db, void* workspace) const {
  detail::require(dy, "dense_backward", "dy");
  if (dw != nullptr) detail::require(x, "dense_backward", "x (needed for dw)");
  if (dx != nullptr) detail::require(w, "dense_backward", "w (needed for dx)");
  const std::size_t pack_size = pack_floats(p);
  detail::Workspace space(workspace, dense_workspace_bytes(p));
  float* pack = detail::Scratch(space.get()).take(pack_size);
  const Index n = p.batch, in = p.in_features, out = p.out_features;
  for (int m = 0; m < p.members; ++m) {
    const float* dym = dy + m * n * out;
    if (db != nullptr) detail::column_sums(dym, n, out, db + m * out);
    if (dw != nullptr) {
      const float* xm = x + (p.shared_input ? 0 : m * n * in);
      detail::gemm(in, out, n, GemmOperand{xm, true}, {dym}, dw + m * in * out, false, pack, pack_size,
                   p.precision);
    }
    if (dx != nullptr) {  // a shared input's dx sums over members, in member order
      float* dxm = dx + (p.shared_input ? 0 : m * n * in);
      detail::gemm(n, in, out, {dym}, GemmOperand{w + m * in * out, true}, dxm, p.shared_input && m > 0, pack,
                   pack_size, p.precision);
    }
  }
}

}  // namespace PMAPCC_CPU_NS
