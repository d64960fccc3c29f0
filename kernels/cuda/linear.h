// Internal to the CUDA kernels: the bias broadcast and the bias-gradient column sums shared by conv2d and
// dense.
#pragma once

#include <cstddef>

namespace pmap::kernels::gpu {

// y (M, rows, cols) += b (M, cols), each row of member m getting b_m. Asynchronous.
void add_bias(int members, std::size_t rows, int cols, const float* b, float* y);

// out (M, cols) = the column sums of a (M, rows, cols), each accumulated in double in a fixed order (so
// deterministic) and rounded once. With `partial` (column_sum_partials(...) doubles of device memory), tall
// inputs are summed by many blocks in chunks of rows; with nullptr, one block per column tile and member
// sums every row (fine for a few thousand rows). Asynchronous.
std::size_t column_sum_partials(int members, std::size_t rows, int cols);
void column_sums(int members, std::size_t rows, int cols, const float* a, float* out, double* partial);

}  // namespace pmap::kernels::gpu
