// The checking macros of CUDA, cuBLAS and cuRAND calls, on the generator of pmap/detail/check.h (as are
// NCCL's and MPI's): a failed call throws a typed pmap error naming the expression, file:line, the
// current GPU and the library's own message. Internal to pmapcc's CUDA sources (src/, kernels/).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <curand.h>

#include <string>

#include <pmap/detail/check.h>
#include <pmap/error.h>

namespace pmap::detail {

// "<expr> failed at <file>:<line> on GPU <n>: <what>". Clears CUDA's last (non-sticky) error.
inline std::string gpu_check_message(const CheckSite& site, const std::string& what) {
  int gpu = -1;
  if (cudaGetDevice(&gpu) != cudaSuccess) gpu = -1;
  cudaGetLastError();
  return check_message(site, "GPU " + std::to_string(gpu), what);
}

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const CheckSite& site) {
  throw CudaError(gpu_check_message(site, std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")"));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const CheckSite& site) {
  throw CublasError(gpu_check_message(site, std::string(cublasGetStatusName(status)) + " (" +
                                            cublasGetStatusString(status) + ")"));
}

// cuRAND has no message function: the status names of curand.h.
inline const char* curand_status_name(curandStatus_t status) {
  switch (status) {
    case CURAND_STATUS_SUCCESS: return "CURAND_STATUS_SUCCESS";
    case CURAND_STATUS_VERSION_MISMATCH: return "CURAND_STATUS_VERSION_MISMATCH (header and library differ)";
    case CURAND_STATUS_NOT_INITIALIZED: return "CURAND_STATUS_NOT_INITIALIZED (generator not initialized)";
    case CURAND_STATUS_ALLOCATION_FAILED: return "CURAND_STATUS_ALLOCATION_FAILED (memory allocation failed)";
    case CURAND_STATUS_TYPE_ERROR: return "CURAND_STATUS_TYPE_ERROR (wrong generator type)";
    case CURAND_STATUS_OUT_OF_RANGE: return "CURAND_STATUS_OUT_OF_RANGE (argument out of range)";
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE: return "CURAND_STATUS_LENGTH_NOT_MULTIPLE (length not a multiple of the dimension)";
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED: return "CURAND_STATUS_DOUBLE_PRECISION_REQUIRED";
    case CURAND_STATUS_LAUNCH_FAILURE: return "CURAND_STATUS_LAUNCH_FAILURE (kernel launch failed)";
    case CURAND_STATUS_PREEXISTING_FAILURE: return "CURAND_STATUS_PREEXISTING_FAILURE (an earlier failure)";
    case CURAND_STATUS_INITIALIZATION_FAILED: return "CURAND_STATUS_INITIALIZATION_FAILED";
    case CURAND_STATUS_ARCH_MISMATCH: return "CURAND_STATUS_ARCH_MISMATCH (GPU architecture not supported)";
    case CURAND_STATUS_INTERNAL_ERROR: return "CURAND_STATUS_INTERNAL_ERROR";
  }
  return "unknown cuRAND status";
}

[[noreturn]] inline void throw_curand_error(curandStatus_t status, const CheckSite& site) {
  throw CurandError(gpu_check_message(site, curand_status_name(status)));
}

}  // namespace pmap::detail

#define PMAPCC_CUDA_CHECK(expr) PMAPCC_CHECK_GEN(expr, cudaSuccess, ::pmap::detail::throw_cuda_error)
#define PMAPCC_CUBLAS_CHECK(expr) PMAPCC_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS, ::pmap::detail::throw_cublas_error)
#define PMAPCC_CURAND_CHECK(expr) PMAPCC_CHECK_GEN(expr, CURAND_STATUS_SUCCESS, ::pmap::detail::throw_curand_error)

// After every kernel launch: a bad configuration (or an earlier asynchronous fault) raises CudaError here.
#define PMAPCC_CHECK_LAUNCH() PMAPCC_CUDA_CHECK(cudaGetLastError())
