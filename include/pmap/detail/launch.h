// How pmapcc's CUDA kernels are written so that the CPU checks them: a kernel is a small struct (its
// arguments, passed by value) with a per-item body `PMAPCC_HD void operator()(std::size_t i) const` that
// touches only item i's outputs (no shared memory, no barriers, no warp intrinsics). One grid-stride
// launcher runs it over `items` items, on a GPU (pmap/detail/launch_gpu.cuh) or on the host
// (host_launch below, over the same grid and in the same thread-to-item order), so a host run executes
// exactly the code and launch geometry the GPU runs. Internal to pmapcc (src/, kernels/, tests/).
#pragma once

#include <cstddef>

#if defined(__CUDACC__)
#define PMAPCC_HD __host__ __device__
#else
#define PMAPCC_HD
#endif

namespace pmap::detail {

// A 1-D launch: `blocks` blocks of `threads` threads; thread t handles items t, t + blocks*threads, ...
struct Grid {
  unsigned blocks = 1;
  unsigned threads = 256;
};

inline constexpr unsigned kLaunchThreads = 256;
inline constexpr unsigned kLaunchMaxBlocks = 65535;

// The grid for `items` work items: one item per thread up to kLaunchMaxBlocks blocks, then grid-stride.
inline Grid grid_for(std::size_t items, unsigned threads = kLaunchThreads, unsigned max_blocks = kLaunchMaxBlocks) {
  const std::size_t blocks = (items + threads - 1) / threads;
  return Grid{static_cast<unsigned>(blocks == 0 ? 1 : (blocks < max_blocks ? blocks : max_blocks)), threads};
}

// Runs kernel(i) for every i < items as the GPU would: global thread t (t < blocks*threads, in order)
// starts at item t and strides by blocks*threads. Single-threaded, so an atomic in a body is a plain add.
template <class K> void host_launch(const K& kernel, std::size_t items, Grid grid) {
  const std::size_t stride = static_cast<std::size_t>(grid.blocks) * grid.threads;
  for (std::size_t t = 0; t < stride && t < items; ++t)
    for (std::size_t i = t; i < items; i += stride) kernel(i);
}

// atomicAdd on the GPU; a plain add in a host run (host_launch runs one item at a time). Integer sums
// are exact in any order, so the GPU's result equals the host run's.
PMAPCC_HD inline void atomic_add(int* target, int value) {
#if defined(__CUDA_ARCH__)
  atomicAdd(target, value);
#else
  *target += value;
#endif
}

}  // namespace pmap::detail
