// CPU average pooling (VALID, any window and stride), forward and backward. Members fold into the batch:
// pooling never mixes images, so (M, N, ...) is handled as M*N images.
#include <algorithm>
#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <pmapcc/kernels/cpu/common.h>
#include <pmapcc/kernels/ops.h>

namespace PMAPCC_CPU_NS {

using detail::Index;

void ConvOpsImpl::avg_pool_forward(AvgPoolParams p, const float* x, float* y) const {
  detail::require(x, "avg_pool_forward", "x");
  detail::require(y, "avg_pool_forward", "y");
  const PoolGeometry g = avg_pool_geometry(p);
  const Index c = p.channels;
  const Index images = Index{p.members} * p.batch;
  const float scale = 1.0f / static_cast<float>(p.window_h * p.window_w);
  // Last image first: x is usually the output a convolution has just written first to last, so its newest
  // lines, still in the caches, are read before they are evicted (the order changes no sum).
  for (Index n = images; n-- > 0;) {
    const float* image = x + n * p.height * p.width * c;
    float* yi = y + n * g.out_height * g.out_width * c;
    for (int oy = 0; oy < g.out_height; ++oy) {
      for (int ox = 0; ox < g.out_width; ++ox, yi += c) {
        // y and x never overlap (restrict); each sum starts from 0 and adds the window in row order, then is
        // scaled.
        float* __restrict out = yi;
        std::fill_n(out, c, 0.0f);
        for (int ky = 0; ky < p.window_h; ++ky) {
          const float* __restrict row =
              image + (Index{oy * p.stride_h + ky} * p.width + Index{ox} * p.stride_w) * c;
          for (int kx = 0; kx < p.window_w; ++kx) {
            for (Index j = 0; j < c; ++j) out[j] += row[kx * c + j];
          }
        }
        for (Index j = 0; j < c; ++j) out[j] *= scale;
      }
    }
  }
}

namespace {

// Windows that tile without overlap (stride == window): every dx is written once, no zero-fill first.
void spread_tiled(const AvgPoolParams& p, const PoolGeometry& g, float scale, const float* dy, float* dx) {
  const Index c = p.channels;
  const Index row_size = Index{p.width} * c;
  const Index covered = Index{g.out_width} * p.window_w * c;  // the rest of a row lies in no window
  const Index images = Index{p.members} * p.batch;
  for (Index n = 0; n < images; ++n) {
    float* image = dx + n * p.height * row_size;
    for (int iy = 0; iy < p.height; ++iy) {
      float* row = image + iy * row_size;
      const int oy = iy / p.window_h;
      if (oy >= g.out_height) {
        std::fill_n(row, row_size, 0.0f);
        continue;
      }
      const float* dy_row = dy + (n * g.out_height + oy) * g.out_width * c;
      for (int ox = 0; ox < g.out_width; ++ox) {
        for (int kx = 0; kx < p.window_w; ++kx) {
          float* out = row + (Index{ox} * p.window_w + kx) * c;
          for (Index j = 0; j < c; ++j) out[j] = dy_row[ox * c + j] * scale;
        }
      }
      std::fill(row + covered, row + row_size, 0.0f);
    }
  }
}

// Any stride: zero dx, then add each dy to its window (overlapping windows sum).
void spread_general(const AvgPoolParams& p, const PoolGeometry& g, float scale, const float* dy, float* dx) {
  const Index c = p.channels;
  const Index images = Index{p.members} * p.batch;
  const Index image_size = Index{p.height} * p.width * c;
  std::fill_n(dx, images * image_size, 0.0f);
  for (Index n = 0; n < images; ++n) {
    float* image = dx + n * image_size;
    for (int oy = 0; oy < g.out_height; ++oy) {
      for (int ox = 0; ox < g.out_width; ++ox, dy += c) {
        for (int ky = 0; ky < p.window_h; ++ky) {
          float* row = image + (Index{oy * p.stride_h + ky} * p.width + Index{ox} * p.stride_w) * c;
          for (int kx = 0; kx < p.window_w; ++kx) {
            for (Index j = 0; j < c; ++j) row[kx * c + j] += dy[j] * scale;
          }
        }
      }
    }
  }
}

// The windows covering input row (or column) i: [first, last], empty when first > last.
struct Cover {
  int first;
  int last;
};

Cover covering(int i, int window, int stride, int outputs) {
  const int hi = std::min(i / stride, outputs - 1);
  const int lo = i < window ? 0 : (i - window) / stride + 1;
  return {lo, hi};
}

// out[j] = mask[j] > 0 ? value[j] : 0 for j < c; out may be mask (Eigen evaluates coefficient-wise).
void masked_store(const float* mask, const Eigen::ArrayXf& value, float* out, Index c) {
  Eigen::Map<const Eigen::ArrayXf> m(mask, c);
  Eigen::Map<Eigen::ArrayXf> o(out, c);
  o = (m > 0.0f).select(value, 0.0f);
}

#if defined(__AVX512F__)
// gather_tiled's rows into a dx that is not r, channels a multiple of 16, dx 64-byte aligned and larger than
// a core's L2 (kStreamBytes): the same bits, stored past the caches (dx is a new buffer as large as r, read
// back by the next backward op from memory anyway): no read for ownership of dx's lines, the memory traffic
// of the in-place pass.
constexpr std::size_t kStreamBytes = std::size_t{1} << 20;
void gather_tiled_streaming(const AvgPoolParams& p, const PoolGeometry& g, float scale, const float* r,
                            const float* dy, float* dx) {
  const Index c = p.channels;
  const Index images = Index{p.members} * p.batch;
  const Index row_size = Index{p.width} * c;
  const __m512 s = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
  for (Index n = 0; n < images; ++n) {
    for (int iy = 0; iy < p.height; ++iy) {
      const Index at = (n * p.height + iy) * row_size;
      const int oy = iy / p.window_h;
      const float* mask = r + at;
      float* out = dx + at;
      if (oy < g.out_height) {
        for (int ox = 0; ox < g.out_width; ++ox) {
          const float* d = dy + ((n * g.out_height + oy) * g.out_width + ox) * c;
          for (int kx = 0; kx < p.window_w; ++kx, out += c, mask += c) {
            for (Index j = 0; j < c; j += 16) {
              const __m512 v = _mm512_add_ps(zero, _mm512_mul_ps(_mm512_loadu_ps(d + j), s));
              const __mmask16 keep = _mm512_cmp_ps_mask(_mm512_loadu_ps(mask + j), zero, _CMP_GT_OQ);
              _mm512_stream_ps(out + j, _mm512_maskz_mov_ps(keep, v));
            }
          }
        }
      }
      for (float* end = dx + at + row_size; out < end; out += 16) _mm512_stream_ps(out, zero);
    }
  }
  _mm_sfence();  // the streamed stores ordered before whatever follows (another thread may read dx)
}
#endif

// gather_masked for windows that tile (stride == window): each input lies in one window or none, so its sum
// is 0 + dy * scale (or 0), the same bits as the general loop gives.
void gather_tiled(const AvgPoolParams& p, const PoolGeometry& g, float scale, const float* r, const float* dy,
                  float* dx) {
  const Index c = p.channels;
#if defined(__AVX512F__)
  const auto bytes = static_cast<std::size_t>(Index{p.members} * p.batch * p.height * p.width * c) * sizeof(float);
  if (dx != r && c % 16 == 0 && reinterpret_cast<std::uintptr_t>(dx) % 64 == 0 && bytes >= kStreamBytes) {
    gather_tiled_streaming(p, g, scale, r, dy, dx);
    return;
  }
#endif
  const Index images = Index{p.members} * p.batch;
  const Index row_size = Index{p.width} * c;
  for (Index n = 0; n < images; ++n) {
    for (int iy = 0; iy < p.height; ++iy) {
      const Index at = (n * p.height + iy) * row_size;
      const int oy = iy / p.window_h;
      const bool inside = oy < g.out_height;  // rows past the last window get no gradient
      const float* mask = r + at;
      float* out = dx + at;  // may be mask: each element is read before it is written
      for (int ox = 0; inside && ox < g.out_width; ++ox) {
        const float* d = dy + ((n * g.out_height + oy) * g.out_width + ox) * c;
        for (int kx = 0; kx < p.window_w; ++kx, out += c, mask += c) {
#if !defined(__clang__)  // (clang, the fuzz build's compiler, has no ivdep and checks the overlap at run time)
#pragma GCC ivdep
#endif
          for (Index j = 0; j < c; ++j) {
            const float v = 0.0f + d[j] * scale;
            out[j] = mask[j] > 0.0f ? v : 0.0f;
          }
        }
      }
      std::fill(out, dx + at + row_size, 0.0f);
    }
  }
}

// The relu-masked gradient gathered input by input: each dx element sums its windows' dy * scale in window
// order (as spread_general adds them, starting from 0), then keeps it where r > 0. Reads r[i] before writing
// dx[i], so dx == r works.
void gather_masked(const AvgPoolParams& p, const PoolGeometry& g, float scale, const float* r, const float* dy,
                   float* dx) {
  const Index c = p.channels;
  const Index images = Index{p.members} * p.batch;
  const Index image_size = Index{p.height} * p.width * c;
  const Index out_image = Index{g.out_height} * g.out_width * c;
  if (p.stride_h == p.window_h && p.stride_w == p.window_w) {
    gather_tiled(p, g, scale, r, dy, dx);
    return;
  }
  Eigen::ArrayXf sum(c);
  for (Index n = 0; n < images; ++n) {
    const float* dy_image = dy + n * out_image;
    for (int iy = 0; iy < p.height; ++iy) {
      const Cover cy = covering(iy, p.window_h, p.stride_h, g.out_height);
      for (int ix = 0; ix < p.width; ++ix) {
        const Cover cx = covering(ix, p.window_w, p.stride_w, g.out_width);
        sum.setZero();
        for (int oy = cy.first; oy <= cy.last; ++oy)
          for (int ox = cx.first; ox <= cx.last; ++ox)
            sum += Eigen::Map<const Eigen::ArrayXf>(dy_image + (Index{oy} * g.out_width + ox) * c, c) * scale;
        const Index at = n * image_size + (Index{iy} * p.width + ix) * c;
        masked_store(r + at, sum, dx + at, c);
      }
    }
  }
}

}  // namespace

void ConvOpsImpl::avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx) const {
  detail::require(r, "avg_pool_relu_backward", "r");
  detail::require(dy, "avg_pool_relu_backward", "dy");
  detail::require(dx, "avg_pool_relu_backward", "dx");
  const PoolGeometry g = avg_pool_geometry(p);
  gather_masked(p, g, 1.0f / static_cast<float>(p.window_h * p.window_w), r, dy, dx);
}

void ConvOpsImpl::avg_pool_backward(AvgPoolParams p, const float* dy, float* dx) const {
  detail::require(dy, "avg_pool_backward", "dy");
  detail::require(dx, "avg_pool_backward", "dx");
  const PoolGeometry g = avg_pool_geometry(p);
  const float scale = 1.0f / static_cast<float>(p.window_h * p.window_w);
  if (p.stride_h == p.window_h && p.stride_w == p.window_w) {
    spread_tiled(p, g, scale, dy, dx);
  } else {
    spread_general(p, g, scale, dy, dx);
  }
}

}  // namespace PMAPCC_CPU_NS
