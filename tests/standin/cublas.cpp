// The stand-in cuBLAS (see pmapcc_standin.h): handles bound to a device, a stream and a workspace, cuBLAS's
// argument checks, and the strided-batched SGEMM (and GemmEx with fp32 or bf16 operands) queued on the
// handle's stream. Its arithmetic is the
// host GEMM's (each entry summed in double in k order, then scaled and rounded once), not cuBLAS's
// algorithms: what the stand-in checks is where and when the work runs, never its last bits.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "standin_internal.h"

struct cublasContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;  // nullptr: cuBLAS's own (not usable under capture here)
  std::size_t workspace_bytes = 0;
};

namespace {

std::mutex handles_mutex;
std::set<cublasContext*>& handles() {
  static auto* h = new std::set<cublasContext*>;
  return *h;
}

cublasStatus_t injected(const char* api) {
  return static_cast<cublasStatus_t>(static_cast<int>(pmapcc_standin::injected(api)));
}

bool live(cublasHandle_t h) {
  std::lock_guard lock(handles_mutex);
  return h != nullptr && handles().count(h) != 0;
}

// The SGEMM of one batch entry, column-major as cuBLAS's: each C entry summed in double over k in order,
// then scaled and rounded once. A column of C is accumulated at a time, over rows (vectorized), from a
// column-major op(A): A^T is first copied out in that layout, which changes no entry's order of sums.
// Not instrumented by ThreadSanitizer, AddressSanitizer or UBSan (they would dominate the suite's time;
// UBSan's pointer checks alone keep the row loops scalar): touch() below reads every operand element and
// writes every result element once, instrumented, so a race or a bad address on any of them is still
// reported.
inline double widen(float x) { return x; }
inline double widen(std::uint16_t bf16) {  // a bf16 value's bits are the high half of the float's
  const std::uint32_t u = static_cast<std::uint32_t>(bf16) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

template <class T>
#if defined(__GNUC__)
__attribute__((no_sanitize("thread", "address", "undefined")))
#endif
void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const T* a, int lda, const T* b, int ldb,
          float beta, float* c, int ldc) {
  // op(A) as doubles, column-major m x k, and four columns' sums: scratch kept by the thread from call to
  // call (a fresh allocation per call, new pages from AddressSanitizer's allocator, cost more than the sums).
  thread_local std::vector<double> op_a_scratch, acc_scratch;
  const auto rows = static_cast<std::size_t>(m);
  if (op_a_scratch.size() < rows * static_cast<std::size_t>(k)) op_a_scratch.resize(rows * static_cast<std::size_t>(k));
  if (acc_scratch.size() < 4 * rows) acc_scratch.resize(4 * rows);
  double* const op_a = op_a_scratch.data();
  double* const acc = acc_scratch.data();
  for (int l = 0; l < k; ++l)
    for (int row = 0; row < m; ++row)
      op_a[static_cast<std::size_t>(l) * static_cast<std::size_t>(m) + static_cast<std::size_t>(row)] =
          widen(ta ? a[l + static_cast<long long>(row) * lda] : a[row + static_cast<long long>(l) * lda]);
  // Four columns of C at a time (each op(A) load feeds four sums), then the rest one by one.
  auto b_at = [&](int l, int col) {
    return widen(tb ? b[col + static_cast<long long>(l) * ldb] : b[l + static_cast<long long>(col) * ldb]);
  };
  for (int col = 0; col < n;) {
    const int cols = n - col >= 4 ? 4 : 1;
    std::fill(acc, acc + 4 * rows, 0.0);
    double* s0 = acc;
    double* s1 = s0 + rows;
    double* s2 = s1 + rows;
    double* s3 = s2 + rows;
    for (int l = 0; l < k; ++l) {
      const double* al = op_a + static_cast<std::size_t>(l) * rows;
      const double b0 = b_at(l, col);
      if (cols == 4) {
        const double b1 = b_at(l, col + 1), b2 = b_at(l, col + 2), b3 = b_at(l, col + 3);
        for (std::size_t row = 0; row < rows; ++row) {
          s0[row] += al[row] * b0;
          s1[row] += al[row] * b1;
          s2[row] += al[row] * b2;
          s3[row] += al[row] * b3;
        }
      } else {
        for (std::size_t row = 0; row < rows; ++row) s0[row] += al[row] * b0;
      }
    }
    for (int j = 0; j < cols; ++j) {
      const double* sj = acc + static_cast<std::size_t>(j) * rows;
      for (int row = 0; row < m; ++row) {
        const double sum = static_cast<double>(alpha) * sj[row];
        float* x = c + row + static_cast<long long>(col + j) * ldc;
        *x = static_cast<float>(beta == 0.0f ? sum : sum + static_cast<double>(beta) * *x);
      }
    }
    col += cols;
  }
}

// Reads each element of op(A) (rows x k) and B, and writes each element of C (m x n) back unchanged (beta
// != 0) or as zero: the GEMM's memory accesses, one per element, where ThreadSanitizer sees them.
template <class T>
void touch(bool ta, bool tb, int m, int n, int k, const T* a, int lda, const T* b, int ldb, float beta, float* c,
           int ldc) {
  volatile T sink = T{};
  for (int l = 0; l < k; ++l)
    for (int row = 0; row < m; ++row)
      sink = ta ? a[l + static_cast<long long>(row) * lda] : a[row + static_cast<long long>(l) * lda];
  for (int col = 0; col < n; ++col)
    for (int l = 0; l < k; ++l)
      sink = tb ? b[col + static_cast<long long>(l) * ldb] : b[l + static_cast<long long>(col) * ldb];
  for (int col = 0; col < n; ++col)
    for (int row = 0; row < m; ++row) {
      float* x = c + row + static_cast<long long>(col) * ldc;
      *x = beta == 0.0f ? 0.0f : *x;
    }
  (void)sink;
}

// Bytes spanned by a column-major matrix of `rows` x `cols` with leading dimension ld, repeated over a batch.
std::size_t span(int rows, int cols, int ld, long long stride, int batch, std::size_t element = sizeof(float)) {
  if (rows == 0 || cols == 0 || batch == 0) return 0;
  const long long one = static_cast<long long>(cols - 1) * ld + rows;
  return static_cast<std::size_t>(static_cast<long long>(batch - 1) * stride + one) * element;
}

// The strided-batched GEMM both entry points share, after their type checks: cuBLAS's argument rules,
// the handle's device, stream and workspace, the operands' memory, then the work queued on the stream.
template <class T>
cublasStatus_t strided_batched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                               int n, int k, const float* alpha, const T* A, int lda, long long strideA, const T* B,
                               int ldb, long long strideB, const float* beta, float* C, int ldc, long long strideC,
                               int batchCount) {
  if (!live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto op_ok = [](cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; };
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  // cuBLAS's argument rules: sizes >= 0, each leading dimension at least its stored matrix's rows.
  if (!op_ok(transa) || !op_ok(transb) || m < 0 || n < 0 || k < 0 || batchCount < 0 || alpha == nullptr ||
      beta == nullptr || lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  if (pmapcc_standin::current_device() != handle->device) return CUBLAS_STATUS_EXECUTION_FAILED;
  const pmapcc_standin::StreamInfo info = pmapcc_standin::stream_info(handle->stream);
  if (!info.valid || info.device != handle->device) return CUBLAS_STATUS_EXECUTION_FAILED;
  // A capture cannot let cuBLAS allocate: the stand-in wants a user workspace there.
  if (info.capturing && handle->workspace == nullptr) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Operands in the handle's GPU memory (on a GPU, a host pointer is an illegal address in the kernel).
  const std::size_t a_bytes = span(ta ? k : m, ta ? m : k, lda, strideA, batchCount, sizeof(T));
  const std::size_t b_bytes = span(tb ? n : k, tb ? k : n, ldb, strideB, batchCount, sizeof(T));
  const std::size_t c_bytes = span(m, n, ldc, strideC, batchCount);
  if ((k > 0 && (pmapcc_standin::pointer_device(A, a_bytes) != handle->device ||
                 pmapcc_standin::pointer_device(B, b_bytes) != handle->device)) ||
      pmapcc_standin::pointer_device(C, c_bytes) != handle->device)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  const float al = *alpha, be = *beta;  // host pointer mode: read at the call
  const cudaError_t queued = pmapcc_standin::enqueue(handle->stream, [=] {
    for (int i = 0; i < batchCount; ++i) {
      touch(ta, tb, m, n, k, A + i * strideA, lda, B + i * strideB, ldb, be, C + i * strideC, ldc);
      gemm(ta, tb, m, n, k, al, A + i * strideA, lda, B + i * strideB, ldb, be, C + i * strideC, ldc);
    }
  });
  if (queued != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (cublasStatus_t s = injected("cublasCreate"); s != CUBLAS_STATUS_SUCCESS) return s;
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  auto* h = new cublasContext;
  h->device = pmapcc_standin::current_device();
  std::lock_guard lock(handles_mutex);
  handles().insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  std::lock_guard lock(handles_mutex);
  if (handle == nullptr || handles().erase(handle) == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (cublasStatus_t s = injected("cublasSetStream"); s != CUBLAS_STATUS_SUCCESS) return s;
  if (!live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const pmapcc_standin::StreamInfo info = pmapcc_standin::stream_info(stream);
  if (!info.valid || info.device != handle->device) return CUBLAS_STATUS_INVALID_VALUE;
  handle->stream = stream;
  // As cuBLAS documents: setting a stream resets the workspace to the default one.
  handle->workspace = nullptr;
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (cublasStatus_t s = injected("cublasSetWorkspace"); s != CUBLAS_STATUS_SUCCESS) return s;
  if (!live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && (workspace == nullptr || reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0 ||
                    pmapcc_standin::pointer_device(workspace, bytes) != handle->device))
    return CUBLAS_STATUS_INVALID_VALUE;  // device memory of the handle's GPU, 256-byte aligned
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "a cuBLAS status the stand-in does not name";
  }
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC,
                                         int batchCount) {
  if (cublasStatus_t s = injected("cublasSgemmStridedBatched"); s != CUBLAS_STATUS_SUCCESS) return s;
  return strided_batched(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc,
                         strideC, batchCount);
}

// The stand-in's subset of the typed GEMM: A and B both fp32 or both bf16, C fp32, fp32 compute with
// float alpha and beta (host pointer mode); any other combination is CUBLAS_STATUS_NOT_SUPPORTED here.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  if (cublasStatus_t s = injected("cublasGemmStridedBatchedEx"); s != CUBLAS_STATUS_SUCCESS) return s;
  if (!live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (Atype != Btype || (Atype != CUDA_R_32F && Atype != CUDA_R_16BF) || Ctype != CUDA_R_32F ||
      computeType != CUBLAS_COMPUTE_32F || algo != CUBLAS_GEMM_DEFAULT)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const auto* al = static_cast<const float*>(alpha);
  const auto* be = static_cast<const float*>(beta);
  auto* c = static_cast<float*>(C);
  if (Atype == CUDA_R_32F)
    return strided_batched(handle, transa, transb, m, n, k, al, static_cast<const float*>(A), lda, strideA,
                           static_cast<const float*>(B), ldb, strideB, be, c, ldc, strideC, batchCount);
  return strided_batched(handle, transa, transb, m, n, k, al, static_cast<const std::uint16_t*>(A), lda, strideA,
                         static_cast<const std::uint16_t*>(B), ldb, strideB, be, c, ldc, strideC, batchCount);
}

}  // extern "C"
