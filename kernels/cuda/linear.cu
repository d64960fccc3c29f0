// Bias broadcast and deterministic column sums (bias gradients) for conv2d and dense.
#include "kernels/cuda/linear.h"

#include "kernels/cuda/context.h"

namespace pmap::kernels::gpu {
namespace {

constexpr int kTileCols = 32;       // columns per block: one warp reads a row segment, coalesced
constexpr int kTileRows = 8;        // row lanes per block
constexpr std::size_t kChunkRows = 1024;  // rows per block of the first pass

__global__ void add_bias_kernel(std::size_t rows, int cols, const float* b, float* y, std::size_t total) {
  const std::size_t per_member = rows * static_cast<std::size_t>(cols);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total; i += stride) {
    const std::size_t m = i / per_member;
    const std::size_t c = i % static_cast<std::size_t>(cols);
    y[i] = y[i] + b[m * static_cast<std::size_t>(cols) + c];
  }
}

// Block (column tile x, row chunk y, member z): lanes sum rows ty, ty + 8, ... of the chunk, then lane
// sums are added in lane order. One chunk: the float result; several: a double partial per chunk.
__global__ void column_sums_pass(std::size_t rows, std::size_t chunk_rows, int cols, const float* a, float* out,
                                 double* partial) {
  __shared__ double lanes[kTileRows][kTileCols];
  const int c = static_cast<int>(blockIdx.x) * kTileCols + static_cast<int>(threadIdx.x);
  const std::size_t first = blockIdx.y * chunk_rows;
  const std::size_t last = first + chunk_rows < rows ? first + chunk_rows : rows;
  const float* am = a + blockIdx.z * rows * static_cast<std::size_t>(cols);
  double acc = 0.0;
  if (c < cols) {
    for (std::size_t r = first + threadIdx.y; r < last; r += kTileRows) acc += am[r * static_cast<std::size_t>(cols) + c];
  }
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  double sum = lanes[0][threadIdx.x];
  for (int k = 1; k < kTileRows; ++k) sum += lanes[k][threadIdx.x];
  if (gridDim.y == 1) {
    out[blockIdx.z * static_cast<std::size_t>(cols) + c] = static_cast<float>(sum);
  } else {
    partial[(blockIdx.z * gridDim.y + blockIdx.y) * static_cast<std::size_t>(cols) + c] = sum;
  }
}

// out[m, c] = the chunks' partial sums of column c, added in chunk order.
__global__ void column_sums_finish(int members, int chunks, int cols, const double* partial, float* out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= members * cols) return;
  const int m = i / cols, c = i % cols;
  double sum = 0.0;
  for (int k = 0; k < chunks; ++k) sum += partial[(static_cast<std::size_t>(m) * chunks + k) * cols + c];
  out[i] = static_cast<float>(sum);
}

std::size_t chunks_for(std::size_t rows) { return rows == 0 ? 1 : (rows + kChunkRows - 1) / kChunkRows; }

}  // namespace

void add_bias(int members, std::size_t rows, int cols, const float* b, float* y) {
  const std::size_t total = static_cast<std::size_t>(members) * rows * static_cast<std::size_t>(cols);
  if (total == 0) return;
  add_bias_kernel<<<grid_for(total), kThreads, 0, current_stream()>>>(rows, cols, b, y, total);
  PMAPCC_CHECK_LAUNCH();
}

std::size_t column_sum_partials(int members, std::size_t rows, int cols) {
  const std::size_t chunks = chunks_for(rows);
  return chunks == 1 ? 0 : static_cast<std::size_t>(members) * chunks * static_cast<std::size_t>(cols);
}

void column_sums(int members, std::size_t rows, int cols, const float* a, float* out, double* partial) {
  const std::size_t chunks = partial == nullptr ? 1 : chunks_for(rows);
  const std::size_t chunk_rows = chunks == 1 ? rows : kChunkRows;
  const dim3 grid((static_cast<unsigned>(cols) + kTileCols - 1) / kTileCols, static_cast<unsigned>(chunks),
                  static_cast<unsigned>(members));
  column_sums_pass<<<grid, dim3(kTileCols, kTileRows), 0, current_stream()>>>(rows, chunk_rows, cols, a, out, partial);
  PMAPCC_CHECK_LAUNCH();
  if (chunks == 1) return;
  const int total = members * cols;
  column_sums_finish<<<grid_for(static_cast<std::size_t>(total)), kThreads, 0, current_stream()>>>(
      members, static_cast<int>(chunks), cols, partial, out);
  PMAPCC_CHECK_LAUNCH();
}

}  // namespace pmap::kernels::gpu
