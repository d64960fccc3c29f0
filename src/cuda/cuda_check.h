// The checking macro family for CUDA runtime calls: a failure throws pmap::CudaError naming the
// expression, file:line, the current device and CUDA's own message.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include <pmap/error.h>

namespace pmap::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  int dev = -1;
  cudaGetDevice(&dev);
  cudaGetLastError();
  throw CudaError(std::string(expr) + " failed at " + file + ":" + std::to_string(line) + " on GPU " +
                  std::to_string(dev) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace pmap::detail

#define PMAPCC_CUDA_CHECK(expr)                                                         \
  do {                                                                                  \
    cudaError_t pmapcc_err_ = (expr);                                                   \
    if (pmapcc_err_ != cudaSuccess) ::pmap::detail::throw_cuda_error(pmapcc_err_, #expr, __FILE__, __LINE__); \
  } while (0)
