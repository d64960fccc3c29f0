// Internal to the CUDA kernels: the workspace alignment, the products (fp32 or bf16), the bias-and-ReLU
// epilogue and the bias-gradient column sums shared by conv2d and dense.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmapcc/kernels/cuda/exec.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::kernels::gpu {

// Workspace pieces of the conv and dense ops start on 256-byte boundaries (cuBLAS's operand alignment).
inline constexpr std::size_t kWorkspaceAlign = 256;
inline std::size_t align_up(std::size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}
inline std::uintptr_t align_up(const void* p) { return align_up(reinterpret_cast<std::uintptr_t>(p)); }

// Bytes of the space product() needs for g's bf16 operands (0 for an fp32 GEMM): both rounded copies,
// each 256-byte aligned, from any start address.
std::size_t bf16_operand_bytes(const Gemm& g);

// C = op(A) op(B) (+ beta C) as g says: an fp32 GEMM, or (g.bf16) A and B rounded into bf16_space
// (bf16_operand_bytes(g) bytes of the device's memory, written on the stream: not in use by queued work)
// by bf16_bits, then the bf16 GEMM with fp32 sums.
void product(const Exec& ex, const Gemm& g, const float* a, const float* b, float* c, void* bf16_space);

// y (M, rows, cols) = y + b_m (each row of member m), then max(., 0) when relu: the epilogue of a GEMM.
// b may be null (no bias); with neither a bias nor relu nothing runs.
void bias_relu(const Exec& ex, int members, std::size_t rows, int cols, const float* b, bool relu, float* y);

// out (M, cols) = the column sums of a (M, rows, cols), each accumulated in double in a fixed order (so
// deterministic) and rounded once. Tall inputs are summed in chunks of rows into `partial`
// (column_sum_partials(...) doubles), then the chunks in order; with a null `partial`, one item sums a
// whole column (slower for tall inputs, same contract).
std::size_t column_sum_partials(int members, std::size_t rows, int cols);
void column_sums(const Exec& ex, int members, std::size_t rows, int cols, const float* a, float* out, double* partial);

}  // namespace pmap::kernels::gpu
