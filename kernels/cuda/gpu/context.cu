// The GPU side of Exec (kernels/cuda/gpu/native.h): per (thread, stream) scratch memory and cuBLAS handles
// with their own workspaces, the GEMM, and fills and copies on the current stream.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pmap/detail/capture.h>
#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/error.h>

#include <pmapcc/kernels/cuda/gpu/native.h>

namespace pmap::kernels::gpu::native {
namespace {

using pmap::detail::current_stream;

// cuBLAS's documented workspace recommendation for Hopper GPUs.
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

// A cuBLAS handle bound to one stream, with a workspace of its own: two streams never share a workspace
// (a thread that switches streams while GEMMs are in flight would otherwise race on it), and a graph
// capture never makes cuBLAS allocate. Created outside captures (prepare(), or the first GEMM).
class Handle {
 public:
  explicit Handle(cudaStream_t stream) {
    pmap::detail::check_not_capturing("creating a cuBLAS handle", "allocates device memory");
    PMAPCC_CUBLAS_CHECK(cublasCreate(&handle_));
    PMAPCC_CUDA_CHECK(cudaMalloc(&workspace_, kCublasWorkspaceBytes));
    PMAPCC_CUBLAS_CHECK(cublasSetStream(handle_, stream));
    PMAPCC_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, kCublasWorkspaceBytes));
  }
  ~Handle() {  // never throws
    cublasDestroy(handle_);
    cudaFree(workspace_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

// Everything one thread keeps on one GPU; freed when the thread exits.
class ThreadGpuContext {
 public:
  explicit ThreadGpuContext(int ordinal) : ordinal_(ordinal) {}
  ~ThreadGpuContext() {  // never throws; the GPU may already be gone at exit
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;
    if (cudaSetDevice(ordinal_) != cudaSuccess) return;
    handles_.clear();
    for (auto& [stream, scratch] : scratch_)
      for (void* p : scratch.buffers) cudaFree(p);
    cudaSetDevice(previous);
  }
  ThreadGpuContext(const ThreadGpuContext&) = delete;
  ThreadGpuContext& operator=(const ThreadGpuContext&) = delete;

  cublasHandle_t handle(cudaStream_t stream) {
    auto it = handles_.find(stream);
    if (it == handles_.end()) it = handles_.emplace(stream, std::make_unique<Handle>(stream)).first;
    return it->second->get();
  }
  // The scratch of `stream`: one per stream, as the cuBLAS workspaces, so that a thread switching streams
  // (StreamScope) while work using one is in flight never hands the same memory to the other (review L4).
  // Grows by allocating a larger buffer; earlier ones stay allocated until the thread exits, so a graph
  // that captured one keeps valid memory.
  void* scratch(cudaStream_t stream, std::size_t bytes) {
    Scratch& s = scratch_[stream];
    if (!s.buffers.empty() && bytes <= s.bytes) return s.buffers.back();
    pmap::detail::check_not_capturing("scratch memory of " + std::to_string(bytes) + " bytes",
                                      "allocates device memory");
    void* p = nullptr;
    PMAPCC_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    s.buffers.push_back(p);
    s.bytes = bytes;
    return p;
  }

 private:
  struct Scratch {
    std::vector<void*> buffers;  // the last is the current one
    std::size_t bytes = 0;
  };
  int ordinal_;
  std::map<cudaStream_t, std::unique_ptr<Handle>> handles_;
  std::map<cudaStream_t, Scratch> scratch_;
};

ThreadGpuContext& context() {
  thread_local std::map<int, std::unique_ptr<ThreadGpuContext>> contexts;
  int ordinal = 0;
  PMAPCC_CUDA_CHECK(cudaGetDevice(&ordinal));
  auto it = contexts.find(ordinal);
  if (it == contexts.end()) it = contexts.emplace(ordinal, std::make_unique<ThreadGpuContext>(ordinal)).first;
  return *it->second;
}

}  // namespace

bool built() { return true; }

std::string cublas_version() {
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)
    return "cuBLAS (version unknown)";
  return "cuBLAS " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

void prepare() { context().handle(current_stream()); }

void* scratch(std::size_t bytes) { return context().scratch(current_stream(), bytes); }

void sgemm(const ColumnMajorGemm& g) {
  // Default math mode: true FP32 (no TF32), so results stay within 1e-5 of the CPU ops.
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  PMAPCC_CUBLAS_CHECK(cublasSgemmStridedBatched(context().handle(current_stream()), op_a, op_b, g.m, g.n, g.k,
                                                &g.alpha, g.a, g.lda, g.stride_a, g.b, g.ldb, g.stride_b, &g.beta,
                                                g.c, g.ldc, g.stride_c, g.batch));
}

void gemm_bf16(const ColumnMajorGemm& g) {
  // bf16 operands, fp32 C and fp32 compute: each product of two bf16 values is exact in fp32 and the sums
  // are fp32 (CUBLAS_COMPUTE_32F, never a reduced-precision accumulation).
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  PMAPCC_CUBLAS_CHECK(cublasGemmStridedBatchedEx(context().handle(current_stream()), op_a, op_b, g.m, g.n, g.k,
                                                 &g.alpha, g.a16, CUDA_R_16BF, g.lda, g.stride_a, g.b16, CUDA_R_16BF,
                                                 g.ldb, g.stride_b, &g.beta, g.c, CUDA_R_32F, g.ldc, g.stride_c,
                                                 g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void fill_zero(void* dst, std::size_t bytes) {
  PMAPCC_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, current_stream()));
}

void copy(void* dst, const void* src, std::size_t bytes) {
  PMAPCC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, current_stream()));
}

}  // namespace pmap::kernels::gpu::native
