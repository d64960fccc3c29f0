// Internal to the CUDA kernels: the bias-and-ReLU epilogue and the bias-gradient column sums shared by
// conv2d and dense, and their precision check.
#pragma once

#include <cstddef>

#include <pmapcc/kernels/cuda/exec.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::kernels::gpu {

// y (M, rows, cols) = y + b_m (each row of member m), then max(., 0) when relu: the epilogue of a GEMM.
// b may be null (no bias); with neither a bias nor relu nothing runs.
void bias_relu(const Exec& ex, int members, std::size_t rows, int cols, const float* b, bool relu, float* y);

// out (M, cols) = the column sums of a (M, rows, cols), each accumulated in double in a fixed order (so
// deterministic) and rounded once. Tall inputs are summed in chunks of rows into `partial`
// (column_sum_partials(...) doubles), then the chunks in order; with a null `partial`, one item sums a
// whole column (slower for tall inputs, same contract).
std::size_t column_sum_partials(int members, std::size_t rows, int cols);
void column_sums(const Exec& ex, int members, std::size_t rows, int cols, const float* a, float* out, double* partial);

// Throws ValueError naming `op` for a precision the CUDA kernels do not run (bf16: not yet).
void require_fp32(Precision precision, const char* op);

}  // namespace pmap::kernels::gpu
