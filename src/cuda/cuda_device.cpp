// CUDA backend: device discovery. A missing or too-old driver counts as zero GPUs, never as an error.
#include <cuda_runtime_api.h>

#include "backend.h"

namespace pmap::detail {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "insufficient driver" / "no device" error
    return 0;
  }
  return n;
}

}  // namespace pmap::detail
