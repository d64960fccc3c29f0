// Where the CUDA backend's work runs, and the one GEMM it is built on. An Exec either queues work on the
// calling thread's current CUDA stream (Exec::gpu()) or runs the very same kernels on the host over their
// whole launch grid, with a host GEMM that takes cuBLAS's column-major arguments (Exec::host()): the
// host run is how the CUDA code is checked on machines without a GPU, against the CPU ops. CUDA-free;
// the GPU side lives in kernels/cuda/gpu (the GPU-only list: cuBLAS numerics, streams, CUDA graphs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>

#include <pmap/detail/launch.h>

#if defined(__CUDACC__) || defined(PMAPCC_CUDA_STANDIN)
#include <pmap/detail/launch_gpu.cuh>
#endif

namespace pmap::kernels {
class Graph;
}

namespace pmap::kernels::gpu {

// Row-major strided-batched GEMM: for i < batch,
//   C_i (m, n) = op(A_i) (m, k) @ op(B_i) (k, n) + beta * C_i
// A_i is stored (m, k), or (k, m) when trans_a; B_i (k, n), or (n, k) when trans_b; C_i (m, n); all
// row-major and contiguous, A_i = a + i * stride_a (in elements; 0 shares one matrix), likewise B, C.
// beta == 0: C is written without being read. bf16: a mixed-precision product, whose A and B are rounded
// to bf16 (bf16_bits below) and multiplied with fp32 sums into fp32 C (product() in linear.h does both).
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  int m = 0, n = 0, k = 0;
  long long stride_a = 0, stride_b = 0, stride_c = 0;
  int batch = 1;
  float beta = 0.0f;
  bool bf16 = false;
};

// A float rounded to bf16 by the CUDA kernels: round to nearest, ties to even, subnormals kept (unlike the
// CPU's vcvtneps2bf16, which flushes them to zero), overflow to infinity, a NaN kept quiet with its sign.
// Integer arithmetic only, and the GPU and the host run this same function: the host run rounds as the GPU.
PMAPCC_HD inline std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(x);
#else
  std::memcpy(&u, &x, sizeof u);
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
PMAPCC_HD inline float bf16_widen(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// The arguments of cublasSgemmStridedBatched (column-major; op(A) is m x k, op(B) k x n, C m x n), or of
// cublasGemmStridedBatchedEx with bf16 A and B when a16 and b16 are set (a and b are then not read).
struct ColumnMajorGemm {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* a = nullptr;
  int lda = 0;
  long long stride_a = 0;
  const float* b = nullptr;
  int ldb = 0;
  long long stride_b = 0;
  float* c = nullptr;
  int ldc = 0;
  long long stride_c = 0;
  int batch = 1;
  const std::uint16_t* a16 = nullptr;
  const std::uint16_t* b16 = nullptr;
};

// The row-major to column-major mapping: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T,
// so the operands swap and keep their transpose flags.
ColumnMajorGemm column_major(const Gemm& g, const float* a, const float* b, float* c);

// cublasSgemmStridedBatched's semantics on the host: each C entry summed in double over k in order, then
// alpha * sum (+ beta * C) rounded to float. The reference the mapping is checked against. With a16 and
// b16 set, the same over the widened bf16 operands (exact: a product of two bf16 values is exact in fp32,
// so the GPU's fp32 sums differ from it only by their order and rounding).
void host_sgemm(const ColumnMajorGemm& g);

class Exec {
 public:
  static Exec gpu() { return Exec(false); }
  static Exec host() { return Exec(true); }
  bool on_host() const { return host_; }

  // Runs kernel(i) for i < items over grid (default: grid_for(items)). GPU: queued on the current stream.
  template <class K> void launch(const K& kernel, std::size_t items) const {
    launch(kernel, items, detail::grid_for(items));
  }
  template <class K> void launch(const K& kernel, std::size_t items, detail::Grid grid) const {
    if (items == 0) return;
    if (host_) {
      run_on_host([kernel, items, grid] { detail::host_launch(kernel, items, grid); });
      return;
    }
#if defined(__CUDACC__) || defined(PMAPCC_CUDA_STANDIN)
    detail::gpu_launch(kernel, items, grid, detail::current_stream());
#else
    no_gpu("a kernel launch");
#endif
  }
  // g.bf16 must be false (ValueError otherwise).
  void gemm(const Gemm& g, const float* a, const float* b, float* c) const;
  // g.bf16 must be true: A and B are already bf16 (bits as bf16_bits gives them), C fp32, fp32 sums
  // (cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F on a GPU).
  void gemm(const Gemm& g, const std::uint16_t* a, const std::uint16_t* b, float* c) const;
  void fill_zero(void* dst, std::size_t bytes) const;                   // asynchronous on a GPU
  void copy(void* dst, const void* src, std::size_t bytes) const;       // within the device's memory
  // `bytes` of scratch for the calling thread's current stream (on a GPU; one per stream, review L4), valid
  // until a larger request (earlier buffers stay alive until the thread exits, so a captured graph never
  // points at freed memory). Growing allocates: it raises CaptureError during a capture.
  void* scratch(std::size_t bytes) const;
  // Creates what the calling thread's work will need (the cuBLAS handle on its stream) up front.
  void prepare() const;
  // A graph of body's work: a CUDA graph of the current stream, or the recording of a host run.
  std::unique_ptr<Graph> capture(const std::function<void()>& body) const;

 private:
  explicit Exec(bool host) : host_(host) {}
  // Runs f now, or appends it to the host capture in progress on this thread.
  static void run_on_host(std::function<void()> f);
  [[noreturn]] static void no_gpu(const char* what);
  bool host_;
};

}  // namespace pmap::kernels::gpu
