// The per-(thread, GPU) CUDA context of the kernels: cuBLAS handle, its workspace, scratch memory.
#include "kernels/cuda/context.h"


#include <map>
#include <string>

#include <pmap/error.h>

namespace pmap::kernels::gpu {
namespace {

// cuBLAS's documented workspace recommendation for Hopper GPUs.
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

// Everything one thread keeps on one GPU; freed when the thread exits.
class ThreadGpuContext {
 public:
  explicit ThreadGpuContext(int ordinal) : ordinal_(ordinal) {
    PMAPCC_CUBLAS_CHECK(cublasCreate(&handle_));
    PMAPCC_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
  }
  ~ThreadGpuContext() {  // never throws; the GPU may already be gone at exit
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) return;
    if (cudaSetDevice(ordinal_) != cudaSuccess) return;
    cublasDestroy(handle_);
    cudaFree(cublas_workspace_);
    cudaFree(scratch_);
    cudaSetDevice(previous);
  }
  ThreadGpuContext(const ThreadGpuContext&) = delete;
  ThreadGpuContext& operator=(const ThreadGpuContext&) = delete;

  // The handle on `stream`. cublasSetStream resets cuBLAS's workspace to its default pool, so a change
  // of stream sets ours again (and an unchanged stream changes nothing).
  cublasHandle_t handle_on(cudaStream_t stream) {
    if (!bound_ || stream != stream_) {
      PMAPCC_CUBLAS_CHECK(cublasSetStream(handle_, stream));
      PMAPCC_CUBLAS_CHECK(cublasSetWorkspace(handle_, cublas_workspace_, kCublasWorkspaceBytes));
      stream_ = stream;
      bound_ = true;
    }
    return handle_;
  }
  void* scratch(std::size_t bytes) {
    if (bytes <= scratch_bytes_) return scratch_;
    if (pmap::detail::current_stream_capturing())
      throw CudaError("kernels: scratch memory must grow to " + std::to_string(bytes) +
                      " bytes during a graph capture; run the step once before capturing it");
    PMAPCC_CUDA_CHECK(cudaStreamSynchronize(current_stream()));  // the old buffer may still be in use
    PMAPCC_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    PMAPCC_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
    scratch_bytes_ = bytes;
    return scratch_;
  }

 private:
  int ordinal_;
  cublasHandle_t handle_ = nullptr;
  void* cublas_workspace_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool bound_ = false;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
};

ThreadGpuContext& context() {
  thread_local std::map<int, ThreadGpuContext> contexts;
  int ordinal = 0;
  PMAPCC_CUDA_CHECK(cudaGetDevice(&ordinal));
  auto it = contexts.find(ordinal);
  if (it == contexts.end()) it = contexts.try_emplace(ordinal, ordinal).first;
  return it->second;
}

}  // namespace

cublasHandle_t cublas() { return context().handle_on(current_stream()); }

void* scratch(std::size_t bytes) { return context().scratch(bytes); }

void require(const void* ptr, const char* op, const char* arg) {
  if (ptr == nullptr) throw ValueError(std::string(op) + ": " + arg + " is null");
}

void gemm(const Gemm& g, const float* a, const float* b, float* c) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands, keep the flags.
  const float alpha = 1.0f;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = g.trans_a ? g.m : g.k;
  const int ldb = g.trans_b ? g.k : g.n;
  PMAPCC_CUBLAS_CHECK(cublasSgemmStridedBatched(cublas(), op_b, op_a, g.n, g.m, g.k, &alpha, b, ldb, g.stride_b, a,
                                                lda, g.stride_a, &g.beta, c, g.n, g.stride_c, g.batch));
}

}  // namespace pmap::kernels::gpu
