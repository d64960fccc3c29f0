// The GPU side of pmap/detail/launch.h: one __global__ grid-stride loop for every kernel struct, launched
// on the calling thread's current stream. CUDA sources only (nvcc), or the CUDA stand-in's build
// (PMAPCC_CUDA_STANDIN, tests/standin), where this is the one seam: the launch queues the host run of the
// same kernel over the same grid on the stream, and the rest of the CUDA code is compiled unchanged.
#pragma once

#include <cuda_runtime.h>
#if defined(PMAPCC_CUDA_STANDIN)
#include <pmapcc_standin.h>
#endif

#include <cstddef>

#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/detail/launch.h>

namespace pmap::detail {

#if defined(PMAPCC_CUDA_STANDIN)

template <class K> void gpu_launch(const K& kernel, std::size_t items, Grid grid, cudaStream_t stream) {
  if (items == 0) return;
  pmapcc_standin::launch(stream, [kernel, items, grid] { host_launch(kernel, items, grid); });
  PMAPCC_CHECK_LAUNCH();
}

#else

template <class K> __global__ void grid_stride_kernel(K kernel, std::size_t items) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < items; i += stride)
    kernel(i);
}

// Queues kernel over `items` items on `stream` (the current stream by default); checks the launch.
template <class K> void gpu_launch(const K& kernel, std::size_t items, Grid grid, cudaStream_t stream) {
  if (items == 0) return;
  grid_stride_kernel<K><<<grid.blocks, grid.threads, 0, stream>>>(kernel, items);
  PMAPCC_CHECK_LAUNCH();
}

#endif  // PMAPCC_CUDA_STANDIN

}  // namespace pmap::detail
