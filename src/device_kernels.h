// The runtime's own CUDA kernels, written as host-runnable kernel structs (pmap/detail/launch.h) so the
// CPU checks them: the device hub's reduction of virtual devices' buffers in rank order, pmean's division and
// the order keys of pmax/pmin over NCCL (launched by src/cuda/device_hub.cu), and the samplers of pmap/random.h (src/cuda/random.cu).
// CUDA-free; tests/test_cuda_host.cpp runs each over its launch grid on the host against the host path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
template <class T> struct MultiplyBy {
  T* x = nullptr;
  T factor = 1;
  PMAPCC_HD void operator()(std::size_t i) const { x[i] = x[i] * factor; }
};

// pmax/pmin over NCCL (review F2). NCCL's ncclMax/ncclMin on floats are fmaxf/fminf, which return the other
// operand when one is NaN; every other path propagates NaN. So floats travel as integers in the same order:
// a float's bits as a signed integer, with a negative float's magnitude bits flipped (-inf < ... < -0 < +0 <
// ... < +inf), and NaN as the largest integer for max (it wins) or the smallest for min. NCCL reduces the
// integers exactly; order_key_value inverts. -0 and +0 are ordered (-0 < +0): max(-0, +0) is +0 and min -0.
template <class I> PMAPCC_HD inline constexpr I order_key_top() {  // the largest I: a NaN's bits as a float
  return static_cast<I>(~(static_cast<std::make_unsigned_t<I>>(1) << (sizeof(I) * 8 - 1)));
}

template <class F, class I> PMAPCC_HD inline I order_key(F x, bool nan_wins_max) {
  static_assert(sizeof(F) == sizeof(I));
  constexpr I top = order_key_top<I>();
  if (x != x) return nan_wins_max ? top : static_cast<I>(-top - 1);
  I bits;
  memcpy(&bits, &x, sizeof bits);
  return bits >= 0 ? bits : static_cast<I>(bits ^ top);
}

template <class F, class I> PMAPCC_HD inline F order_key_value(I key) {
  constexpr I top = order_key_top<I>();
  const I bits = key == static_cast<I>(-top - 1) ? top : key >= 0 ? key : static_cast<I>(key ^ top);
  F x;  // top's bits are a quiet NaN
  memcpy(&x, &bits, sizeof x);
  return x;
}

// The buffer's n elements of F, in place, to order keys (ToOrderKeys) and back (FromOrderKeys). Elements are
// read and written through memcpy: the buffer holds F before and I after, or the other way round.
template <class F, class I> struct ToOrderKeys {
  const void* x = nullptr;
  void* keys = nullptr;  // may be x
  bool nan_wins_max = true;
  PMAPCC_HD void operator()(std::size_t i) const {
    F v;
    memcpy(&v, static_cast<const char*>(x) + i * sizeof(F), sizeof v);
    const I k = order_key<F, I>(v, nan_wins_max);
    memcpy(static_cast<char*>(keys) + i * sizeof(I), &k, sizeof k);
  }
};

template <class F, class I> struct FromOrderKeys {
  void* buffer = nullptr;
  PMAPCC_HD void operator()(std::size_t i) const {
    I k;
    memcpy(&k, static_cast<const char*>(buffer) + i * sizeof(I), sizeof k);
    const F v = order_key_value<F, I>(k);
    memcpy(static_cast<char*>(buffer) + i * sizeof(F), &v, sizeof v);
  }
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
