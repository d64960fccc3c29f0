// Internal to the CPU kernels: the one GEMM entry point, C (+)= A @ B on row-major float buffers, with the
// packing space taken from the caller's workspace so that no GEMM allocates.
#pragma once

#include <cstddef>

#include <pmapcc/kernels/cpu/common.h>

namespace PMAPCC_CPU_NS::detail {

// An operand of gemm: a row-major buffer holding the matrix itself, or (transposed) its transpose.
struct GemmOperand {
  const float* data;
  bool transposed = false;
};

// Floats of packing space gemm needs for C (rows, cols) = A (rows, depth) @ B (depth, cols): Eigen's
// blocking sizes for this machine's caches, plus alignment slack.
std::size_t gemm_pack_floats(Index rows, Index cols, Index depth);

// c (rows, cols), row-major, contiguous = a @ b, or += a @ b with accumulate. pack: at least
// gemm_pack_floats(rows, cols, depth) floats (any contents; 64-byte aligned is best); nullptr or too small
// lets Eigen allocate its own. Results are those of Eigen's c.noalias() (+)= a * b, bit for bit.
void gemm(Index rows, Index cols, Index depth, GemmOperand a, GemmOperand b, float* c, bool accumulate,
          float* pack, std::size_t pack_floats);

}  // namespace PMAPCC_CPU_NS::detail
