// The per-element arithmetic of LayoutOps (kernels/layout_ops.h), shared by the CPU ops and the CUDA kernels
// (PMAPCC_HD) so both compute every element with the same code in the same order: one function per output
// element of a copy, a reduction and max pooling's forward and backward.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmap/detail/launch.h>

#include <pmapcc/kernels/layout_ops.h>

namespace pmap::kernels {

// The source and destination offsets of copy item i (row-major over p.dims).
PMAPCC_HD inline void strided_copy_offsets(const StridedCopyParams& p, std::size_t i, std::int64_t& src,
                                           std::int64_t& dst) {
  src = p.src_offset;
  dst = p.dst_offset;
  for (int k = p.ndim - 1; k >= 0; --k) {
    const auto n = static_cast<std::size_t>(p.dims[k]);
    const auto ik = static_cast<std::int64_t>(i % n);
    i /= n;
    src += ik * p.src_strides[k];
    dst += ik * p.dst_strides[k];
  }
}

// The offset in x of index i (row-major) over `ndim` extents with these strides.
PMAPCC_HD inline std::int64_t strided_offset(int ndim, const std::int64_t* dims, const std::int64_t* strides,
                                             std::size_t i) {
  std::int64_t off = 0;
  for (int k = ndim - 1; k >= 0; --k) {
    const auto n = static_cast<std::size_t>(dims[k]);
    off += static_cast<std::int64_t>(i % n) * strides[k];
    i /= n;
  }
  return off;
}

PMAPCC_HD inline std::size_t extent_count(int ndim, const std::int64_t* dims) {
  std::size_t n = 1;
  for (int k = 0; k < ndim; ++k) n *= static_cast<std::size_t>(dims[k]);
  return n;
}

// y[o]: the reduction of output element o (see StridedReduceParams).
PMAPCC_HD inline float strided_reduce_value(ReduceOp op, const StridedReduceParams& p, const float* x,
                                            std::size_t o) {
  const float* base = x + strided_offset(p.outer_ndim, p.outer_dims, p.outer_strides, o);
  const std::size_t count = extent_count(p.inner_ndim, p.inner_dims);
  if (op == ReduceOp::max) {
    float best = base[strided_offset(p.inner_ndim, p.inner_dims, p.inner_strides, 0)];
    for (std::size_t j = 0; j < count && best == best; ++j) {  // stops at the first NaN
      const float v = base[strided_offset(p.inner_ndim, p.inner_dims, p.inner_strides, j)];
      if (v > best || v != v) best = v;
    }
    return best;
  }
  double acc = 0.0;
  for (std::size_t j = 0; j < count; ++j) acc += base[strided_offset(p.inner_ndim, p.inner_dims, p.inner_strides, j)];
  return static_cast<float>(op == ReduceOp::mean ? acc / static_cast<double>(count) : acc);
}

// The index in x of the element window (image, oy, ox) of channel c chooses: its first NaN, else its first
// maximum in window order (padded positions skipped; every window holds at least one input).
PMAPCC_HD inline std::size_t max_pool_choice(const MaxPoolParams& p, const MaxPoolGeometry& g, const float* x,
                                             std::size_t image, int oy, int ox, int c) {
  const int y0 = oy * p.stride_h - g.pad_top, x0 = ox * p.stride_w - g.pad_left;
  bool found = false;
  std::size_t best_i = 0;
  float best = 0.0f;
  for (int ky = 0; ky < p.window_h; ++ky) {
    const int iy = y0 + ky;
    if (iy < 0 || iy >= p.height) continue;
    for (int kx = 0; kx < p.window_w; ++kx) {
      const int ix = x0 + kx;
      if (ix < 0 || ix >= p.width) continue;
      const std::size_t i = ((image * p.height + iy) * p.width + ix) * p.channels + c;
      const float v = x[i];
      if (v != v) return i;
      if (!found || v > best) best = v, best_i = i, found = true;
    }
  }
  return best_i;
}

// y[o] of max_pool_forward, o indexing (N, OH, OW, C).
PMAPCC_HD inline float max_pool_value(const MaxPoolParams& p, const MaxPoolGeometry& g, const float* x,
                                      std::size_t o) {
  const int c = static_cast<int>(o % p.channels);
  std::size_t t = o / p.channels;
  const int ox = static_cast<int>(t % g.out_width);
  t /= g.out_width;
  const int oy = static_cast<int>(t % g.out_height);
  return x[max_pool_choice(p, g, x, t / g.out_height, oy, ox, c)];
}

// dx[i] of max_pool_backward, i indexing (N, H, W, C): the dy of every window holding the element that
// chose it, in output order (a single one kept exactly, -0 included).
PMAPCC_HD inline float max_pool_grad_value(const MaxPoolParams& p, const MaxPoolGeometry& g, const float* x,
                                           const float* dy, std::size_t i) {
  const int c = static_cast<int>(i % p.channels);
  std::size_t t = i / p.channels;
  const int ix = static_cast<int>(t % p.width);
  t /= p.width;
  const int iy = static_cast<int>(t % p.height);
  const std::size_t image = t / p.height;
  // Windows oy with oy * stride - pad <= iy < oy * stride - pad + window, likewise ox.
  const int ay = iy + g.pad_top - p.window_h + 1, ax = ix + g.pad_left - p.window_w + 1;
  const int oy_lo = ay <= 0 ? 0 : (ay + p.stride_h - 1) / p.stride_h;
  const int ox_lo = ax <= 0 ? 0 : (ax + p.stride_w - 1) / p.stride_w;
  const int oy_top = (iy + g.pad_top) / p.stride_h, ox_top = (ix + g.pad_left) / p.stride_w;
  const int oy_hi = oy_top < g.out_height - 1 ? oy_top : g.out_height - 1;
  const int ox_hi = ox_top < g.out_width - 1 ? ox_top : g.out_width - 1;
  bool any = false;
  float acc = 0.0f;
  for (int oy = oy_lo; oy <= oy_hi; ++oy) {
    for (int ox = ox_lo; ox <= ox_hi; ++ox) {
      if (max_pool_choice(p, g, x, image, oy, ox, c) != i) continue;
      const float d = dy[((image * g.out_height + oy) * g.out_width + ox) * p.channels + c];
      acc = any ? acc + d : d;
      any = true;
    }
  }
  return acc;
}

}  // namespace pmap::kernels
