// The GPU side of pmap/detail/launch.h: one __global__ grid-stride loop for every kernel struct, launched
// on the calling thread's current stream. CUDA sources only (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/detail/launch.h>

namespace pmap::detail {

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

}  // namespace pmap::detail
