// CPU matmul: the kernels' GEMM as an op of its own, one call per member (bench_train's sgemm rate).
#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/cpu/gemm.h>

namespace PMAPCC_CPU_NS {

std::size_t Ops::matmul_workspace_bytes(MatmulParams p) const {
  validate(p);
  return detail::gemm_pack_floats(p.rows, p.cols, p.depth) * sizeof(float) + detail::Scratch::kAlign;
}

void Ops::matmul(MatmulParams p, const float* a, const float* b, float* c, void* workspace) const {
  detail::require(a, "matmul", "a");
  detail::require(b, "matmul", "b");
  detail::require(c, "matmul", "c");
  const std::size_t pack_size = detail::gemm_pack_floats(p.rows, p.cols, p.depth);
  detail::Workspace space(workspace, matmul_workspace_bytes(p));
  float* pack = detail::Scratch(space.get()).take(pack_size);
  const detail::Index rows = p.rows, cols = p.cols, depth = p.depth;
  for (int m = 0; m < p.members; ++m) {
    detail::gemm(rows, cols, depth, {a + m * rows * depth, p.transpose_a}, {b + m * depth * cols, p.transpose_b},
                 c + m * rows * cols, p.accumulate, pack, pack_size);
  }
}

}  // namespace PMAPCC_CPU_NS
