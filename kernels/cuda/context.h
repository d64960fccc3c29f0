// Internal to the CUDA kernels: the calling thread's cuBLAS handle and scratch memory on its current GPU,
// launch-size helpers, argument checks, and the row-major strided-batched GEMM every op builds on.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>

namespace pmap::kernels::gpu {

using pmap::detail::current_stream;

// The calling thread's cuBLAS handle for its current GPU, on the current stream: created once per
// (thread, GPU) with its own workspace (so a graph capture never makes cuBLAS allocate), re-pointed when
// the thread's stream changes. Default math mode: true FP32 (no TF32), so results stay within 1e-5 of the
// CPU ops.
cublasHandle_t cublas();

// `bytes` of device scratch for the calling thread on its current GPU, valid until the next call with
// more bytes (it only grows). Growing allocates: raises CudaError while the stream is being captured, so
// run a step once before capturing it.
void* scratch(std::size_t bytes);

// Threads per block of the element-wise kernels, and a grid covering n items (grid-stride loops do the
// rest past the cap).
inline constexpr int kThreads = 256;
inline unsigned grid_for(std::size_t n, int threads = kThreads) {
  const std::size_t blocks = (n + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads);
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < 65535 ? blocks : 65535));
}

// Throws pmap::ValueError "<op>: <arg> is null" when ptr is null.
void require(const void* ptr, const char* op, const char* arg);

// Row-major strided-batched GEMM on the current stream: for i < batch,
//   C_i (m, n) = op(A_i) (m, k) @ op(B_i) (k, n) + beta * C_i
// A_i is stored (m, k), or (k, m) when trans_a; B_i (k, n), or (n, k) when trans_b; C_i (m, n); all
// row-major and contiguous, A_i = a + i * stride_a (in elements; 0 shares one matrix), likewise B, C.
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
  int batch = 1;
  float beta = 0.0f;
};
void gemm(const Gemm& g, const float* a, const float* b, float* c);

}  // namespace pmap::kernels::gpu
