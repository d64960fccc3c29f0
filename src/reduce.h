// Element-wise reductions in rank order, shared by the thread hub and the MPI exchange so that a
// collective produces the same bits whether its devices live in one process or in several.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <pmap/communicator.h>
#include <pmap/dtype.h>

namespace pmap::detail {

inline constexpr std::size_t kReduceBlock = 2048;  // elements reduced per step (fits in L1 with a few inputs)

// memcpy, but copies under 256 KiB go in 64-byte pieces the compiler keeps in vector registers: glibc hands
// copies from 4 KiB up to a few hundred KiB to `rep movsb`, which on the AMD EPYC VMs we test on runs at
// ~3 GB/s for some relative alignments of source and destination (dst - src = 8 or 16 mod 4096), against
// 40-90 GB/s otherwise. Larger copies keep glibc's own (streaming) path.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;  // an empty array's pointers may be null, which memcpy must not be given
  if (bytes >= (std::size_t{256} << 10)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) std::memcpy(d + i, s + i, 64);
  std::memcpy(d + i, s + i, bytes - i);
}

// a op b; max/min propagate NaN.
template <class T> inline T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return static_cast<T>(a + b);
    case ReduceOp::max:
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return a < b ? b : a;
    case ReduceOp::min:
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
      }
      return b < a ? b : a;
  }
  return a;
}

// acc[i] = ((in_0[off+i] op in_1[off+i]) op in_2[off+i]) ... in rank order: the same bits wherever it
// is computed.
template <class T>
void reduce_block(const std::vector<const T*>& in, std::size_t off, std::size_t len, ReduceOp op, T* acc) {
  const T* first = in[0] + off;
  if (in.size() == 1) return copy_bytes(acc, first, len * sizeof(T));
  const T* second = in[1] + off;  // the first pass reads two inputs: no pass that only copies in_0
  for (std::size_t i = 0; i < len; ++i) acc[i] = combine(first[i], second[i], op);
  for (std::size_t k = 2; k < in.size(); ++k) {
    const T* src = in[k] + off;
    for (std::size_t i = 0; i < len; ++i) acc[i] = combine(acc[i], src[i], op);
  }
}

// Unaligned loads and stores of a vector type, through memcpy.
template <class V, class T> inline V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class T, class V> inline void store(T* p, const V& v) { std::memcpy(p, &v, sizeof(V)); }

// Sums 64 bytes of every input at a time, as four 16-byte vectors (the SSE2 width every x86-64 has; GCC
// and Clang vector types, because plain -O2 does not vectorise the scalar loop, which it cannot prove free
// of overlaps; wider vector types than the target has compile to poor code), and stores the sum to every
// output: no scratch buffer, each input and output touched once.
// Each element is summed in rank order, one addition per input, so the bits are those of the scalar loop.
template <class T>
void sum_range(const std::vector<const T*>& in, const std::vector<T*>& out, std::size_t len) {
  using V [[gnu::vector_size(16)]] = T;  // accessed with memcpy: the buffers need only T's alignment
  constexpr std::size_t kLanes = sizeof(V) / sizeof(T);
  const std::size_t n_in = in.size(), n_out = out.size();
  const T* const* src = in.data();
  T* const* dst = out.data();
  std::size_t i = 0;
  for (; i + 4 * kLanes <= len; i += 4 * kLanes) {
    const T* s0 = src[0] + i;
    V a0 = load<V>(s0), a1 = load<V>(s0 + kLanes), a2 = load<V>(s0 + 2 * kLanes), a3 = load<V>(s0 + 3 * kLanes);
    for (std::size_t k = 1; k < n_in; ++k) {
      const T* sk = src[k] + i;
      a0 += load<V>(sk), a1 += load<V>(sk + kLanes), a2 += load<V>(sk + 2 * kLanes), a3 += load<V>(sk + 3 * kLanes);
    }
    for (std::size_t k = 0; k < n_out; ++k) {
      T* d = dst[k] + i;
      store(d, a0), store(d + kLanes, a1), store(d + 2 * kLanes, a2), store(d + 3 * kLanes, a3);
    }
  }
  for (; i < len; ++i) {
    T acc = src[0][i];
    for (std::size_t k = 1; k < n_in; ++k) acc = static_cast<T>(acc + src[k][i]);
    for (std::size_t k = 0; k < n_out; ++k) dst[k][i] = acc;
  }
}

// Reduces `len` elements of every rank's buffer in `sends` (rank order, from element src_off) and
// writes them to each buffer in `outs` (from element dst_off). Every input element is read before the
// output element at the same position is written, so an output may alias its rank's input at the same
// elements when only this caller touches them; outputs must not overlap inputs anywhere else.
template <class T>
void reduce_range(const std::vector<const void*>& sends, const std::vector<void*>& outs, std::size_t src_off,
                  std::size_t dst_off, std::size_t len, ReduceOp op) {
  std::vector<const T*> in(sends.size());
  for (std::size_t k = 0; k < sends.size(); ++k) in[k] = static_cast<const T*>(sends[k]) + src_off;
  std::vector<T*> out(outs.size());
  for (std::size_t k = 0; k < outs.size(); ++k) out[k] = static_cast<T*>(outs[k]) + dst_off;
  if (op == ReduceOp::sum && in.size() > 1) return sum_range(in, out, len);
  alignas(64) T acc[kReduceBlock];
  for (std::size_t b = 0; b < len; b += kReduceBlock) {
    std::size_t n = std::min(kReduceBlock, len - b);
    reduce_block(in, b, n, op, acc);
    // n <= kReduceBlock, which GCC's range analysis loses under -fsanitize=undefined (a false
    // -Warray-bounds on acc); stating it keeps that build warning-free and costs nothing.
    if (n > kReduceBlock) __builtin_unreachable();
    for (T* o : out) copy_bytes(o + b, acc, n * sizeof(T));
  }
}

// Calls f(T{}) with the C++ type of dtype `t`.
template <class F> void with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::i32: return f(std::int32_t{});
    case DType::i64: return f(std::int64_t{});
    case DType::u32: return f(std::uint32_t{});
    case DType::u8: return f(std::uint8_t{});
  }
}

inline const char* reduce_name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : op == ReduceOp::max ? "max" : "min";
}

}  // namespace pmap::detail
