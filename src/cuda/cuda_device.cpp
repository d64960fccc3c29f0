// CUDA backend: device discovery, memory and copies. A missing or too-old driver counts as zero GPUs.
#include <cuda_runtime_api.h>

#include <pmap/device.h>

#include "backend.h"
#include "cuda/cuda_check.h"

namespace pmap::detail {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "insufficient driver" / "no device" error
    return 0;
  }
  return n;
}

void* cuda_alloc(int ordinal, std::size_t bytes) {
  PMAPCC_CUDA_CHECK(cudaSetDevice(ordinal));
  void* p = nullptr;
  PMAPCC_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void cuda_free(int ordinal, void* ptr) noexcept {
  if (ptr == nullptr) return;
  if (cudaSetDevice(ordinal) == cudaSuccess) cudaFree(ptr);  // destructors never throw
}

void cuda_memset_zero(int ordinal, void* ptr, std::size_t bytes) {
  PMAPCC_CUDA_CHECK(cudaSetDevice(ordinal));
  PMAPCC_CUDA_CHECK(cudaMemset(ptr, 0, bytes));
}

void cuda_copy(void* dst, const Device& dst_device, const void* src, const Device& src_device,
               std::size_t bytes) {
  const Device& active = dst_device.is_cpu() ? src_device : dst_device;
  PMAPCC_CUDA_CHECK(cudaSetDevice(active.ordinal));
  if (!dst_device.is_cpu() && !src_device.is_cpu() && dst_device.ordinal != src_device.ordinal) {
    PMAPCC_CUDA_CHECK(cudaMemcpyPeer(dst, dst_device.ordinal, src, src_device.ordinal, bytes));
  } else {
    PMAPCC_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  }
}

void cuda_bind_thread(int ordinal) { PMAPCC_CUDA_CHECK(cudaSetDevice(ordinal)); }

}  // namespace pmap::detail
