// Internal to the CPU kernels: the one GEMM entry point, C (+)= A @ B on row-major float buffers, with the
// packing space taken from the caller's workspace so that no GEMM allocates.
#pragma once

#include <cstddef>

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/ops.h>

namespace PMAPCC_CPU_NS::detail {

// An operand of gemm: a row-major buffer holding the matrix itself, or (transposed) its transpose, whose
// rows lie `stride` floats apart (0: contiguous rows, as wide as the matrix stored). Only a's stride may be
// set (gemm splits its rows over helper threads this way).
struct GemmOperand {
  const float* data;
  bool transposed = false;
  Index stride = 0;
};

// Floats of packing space gemm needs for C (rows, cols) = A (rows, depth) @ B (depth, cols): Eigen's
// blocking sizes for this machine's caches, plus alignment slack; with bf16, the bf16 GEMM's.
std::size_t gemm_pack_floats(Index rows, Index cols, Index depth, Precision precision = Precision::fp32);

// c (rows, cols), row-major, contiguous = a @ b, or += a @ b with accumulate. pack: at least
// gemm_pack_floats(rows, cols, depth, precision) floats (any contents; 64-byte aligned is best). fp32:
// results are those of Eigen's c.noalias() (+)= a * b, bit for bit (nullptr or too small a pack lets Eigen
// allocate its own), except where the avx512 variant runs its own GEMM (avx512_gemm_suits, below). bf16:
// kernels/cpu/shared/bf16_gemm.h's product of the rounded operands (call require_precision first; a missing or small
// pack throws).
void gemm(Index rows, Index cols, Index depth, GemmOperand a, GemmOperand b, float* c, bool accumulate,
          float* pack, std::size_t pack_floats, Precision precision = Precision::fp32);

// Throws ValueError naming `op` when this variant cannot run `precision`: bf16 runs in the avx512 variant
// on a CPU with AVX512_BF16 (so PMAPCC_CPU_ISA=avx2 or generic refuses it too).
void require_precision(Precision precision, const char* op);

#if defined(__AVX512F__)
// kernels/cpu/gemm_avx512.cpp: the avx512 variant's own fp32 GEMM, which gemm runs where avx512_gemm_suits
// (B row-major, depth at most 1024). Same contract as gemm, without packing space.
bool avx512_gemm_suits(Index rows, Index cols, Index depth, GemmOperand b);
void avx512_gemm(Index rows, Index cols, Index depth, GemmOperand a, const float* b, float* c, bool accumulate);
#endif

}  // namespace PMAPCC_CPU_NS::detail
