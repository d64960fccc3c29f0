// The runtime's own CUDA kernels, written as host-runnable kernel structs (pmap/detail/launch.h) so the
// CPU checks them: the device hub's reduction of virtual devices' buffers in rank order and pmean's
// division (launched by src/cuda/device_hub.cu), and the samplers of pmap/random.h (src/cuda/random.cu).
// CUDA-free; tests/test_cuda_host.cpp runs each over its launch grid on the host against the host path.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmap/communicator.h>
#include <pmap/detail/launch.h>
#include <pmap/detail/philox.h>

#include "cuda_seam.h"

namespace pmap::detail {

// ---- The device hub -----------------------------------------------------------------------------------

inline constexpr int kMaxDeviceRanks = 64;  // virtual devices on one GPU that one collective can combine

// The ranks' buffers, passed to kernels by value.
struct RankPointers {
  const void* in[kMaxDeviceRanks];
  void* out[kMaxDeviceRanks];
  int n = 0;
};

// a op b as the host hub's combine() (src/reduce.h): max and min propagate NaN (x != x is NaN's test).
template <class T> PMAPCC_HD inline T combine_ranks(T a, T b, ReduceOp op) {
  if (op == ReduceOp::sum) return static_cast<T>(a + b);
  if (a != a) return a;  // NaN (never true for integers)
  if (b != b) return b;
  if (op == ReduceOp::max) return a < b ? b : a;
  return b < a ? b : a;
}

// out_k[dst_off + i] = in_0[src_off + i] op ... op in_{n-1}[src_off + i], for every out_k and i < len.
template <class T> struct ReduceRanks {
  RankPointers p;
  int outs = 0;
  std::size_t src_off = 0, dst_off = 0;
  ReduceOp op = ReduceOp::sum;
  PMAPCC_HD void operator()(std::size_t i) const {
    T acc = static_cast<const T*>(p.in[0])[src_off + i];
    for (int k = 1; k < p.n; ++k) acc = combine_ranks(acc, static_cast<const T*>(p.in[k])[src_off + i], op);
    for (int k = 0; k < outs; ++k) static_cast<T*>(p.out[k])[dst_off + i] = acc;
  }
};

// x[i] = x[i] / divisor (pmean's division, rounded as the host's).
template <class T> struct DivideBy {
  T* x = nullptr;
  T divisor = 1;
  PMAPCC_HD void operator()(std::size_t i) const { x[i] = x[i] / divisor; }
};

// The grid of the hub's kernels: up to 4096 blocks, then grid-stride.
inline Grid hub_grid(std::size_t items) { return grid_for(items, kLaunchThreads, 4096); }

// ---- Samplers ------------------------------------------------------------------------------------------

// What one sampler launch draws; element i is word i % 4 of Philox block i / 4 of the key's stream.
struct SampleParams {
  SampleKind kind = SampleKind::bits;
  std::uint64_t seed = 0;
  float a = 0.0f, b = 0.0f;
  TruncatedNormalParams truncated{};
  void* out = nullptr;
  std::size_t count = 0;
};

// One item per Philox block: writes its (up to 4) elements of the requested distribution.
struct SampleBlocks {
  SampleParams p;
  PMAPCC_HD void operator()(std::size_t block) const {
    const Philox4 w = curand_host_block(p.seed, block);
    const std::size_t first = block * 4;
    const std::size_t left = p.count - first;
    const int valid = left < 4 ? static_cast<int>(left) : 4;
    switch (p.kind) {
      case SampleKind::bits: {
        auto* out = static_cast<std::uint32_t*>(p.out) + first;
        for (int k = 0; k < valid; ++k) out[k] = w.v[k];
        break;
      }
      case SampleKind::uniform: {
        auto* out = static_cast<float*>(p.out) + first;
        for (int k = 0; k < valid; ++k) out[k] = uniform_in_range(uniform_from_bits(w.v[k]), p.a, p.b);
        break;
      }
      case SampleKind::normal: {
        const Float2 low = box_muller(w.v[0], w.v[1]);
        const Float2 high = box_muller(w.v[2], w.v[3]);
        const float z[4] = {low.x, low.y, high.x, high.y};
        auto* out = static_cast<float*>(p.out) + first;
        for (int k = 0; k < valid; ++k) out[k] = scale_normal(z[k], p.a, p.b);
        break;
      }
      case SampleKind::truncated_normal: {
        auto* out = static_cast<float*>(p.out) + first;
        for (int k = 0; k < valid; ++k) out[k] = truncated_normal_from_bits(w.v[k], p.truncated);
        break;
      }
      case SampleKind::bernoulli: {
        auto* out = static_cast<std::uint8_t*>(p.out) + first;
        for (int k = 0; k < valid; ++k) out[k] = uniform_from_bits(w.v[k]) <= p.a ? 1 : 0;
        break;
      }
    }
  }
};

// The launch of a request: its parameters, items (Philox blocks) and grid (up to 8192 blocks).
inline SampleParams sample_params(const SampleRequest& r) {
  SampleParams p;
  p.kind = r.kind;
  p.seed = philox_seed(r.key);
  p.a = r.a;
  p.b = r.b;
  if (r.kind == SampleKind::truncated_normal) p.truncated = truncated_normal_params(r.a, r.b);
  p.out = r.out;
  p.count = r.count;
  return p;
}
inline std::size_t sample_items(std::size_t count) { return (count + 3) / 4; }
inline Grid sample_grid(std::size_t count) { return grid_for(sample_items(count), kLaunchThreads, 8192); }

}  // namespace pmap::detail
