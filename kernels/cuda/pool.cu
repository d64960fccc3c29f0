// CUDA average pooling (VALID, any window and stride), forward and backward, one item per output
// (forward) or input (backward) element. The sums run in the CPU's order without FMA, so the results are
// bitwise those of the CPU ops.
#include <pmapcc/kernels/cuda/backend.h>

namespace pmap::kernels::gpu {
namespace {

struct PoolPlan {
  AvgPoolParams p;
  PoolGeometry g;
  float scale;  // 1 / (window_h * window_w)
  bool tiled;   // stride == window: every input lies in at most one window
};

PoolPlan make_plan(const AvgPoolParams& p) {
  const PoolGeometry g = avg_pool_geometry(p);  // validates p
  return PoolPlan{p, g, 1.0f / static_cast<float>(p.window_h * p.window_w),
                  p.stride_h == p.window_h && p.stride_w == p.window_w};
}

// y (images, OH, OW, C): each the window sum in (ky, kx) order, times scale.
struct PoolForward {
  PoolPlan plan;
  const float* x;
  float* y;
  PMAPCC_HD void operator()(std::size_t i) const {
    const AvgPoolParams& p = plan.p;
    const int c = static_cast<int>(i % p.channels);
    std::size_t t = i / p.channels;
    const int ox = static_cast<int>(t % plan.g.out_width);
    t /= plan.g.out_width;
    const int oy = static_cast<int>(t % plan.g.out_height);
    const std::size_t image = t / plan.g.out_height;
    const float* base = x + image * p.height * p.width * p.channels;
    float acc = 0.0f;
    for (int ky = 0; ky < p.window_h; ++ky) {
      const float* row = base + (static_cast<std::size_t>(oy * p.stride_h + ky) * p.width + ox * p.stride_w) * p.channels;
      for (int kx = 0; kx < p.window_w; ++kx) acc += row[kx * p.channels + c];
    }
    y[i] = acc * plan.scale;
  }
};

// dx (images, H, W, C): the sum over the windows holding the pixel (output pixels ascending) of dy * scale;
// 0 outside every window. With `r` (the pool's input, a ReLU's output): 0 where r <= 0 as well, and dx may
// be r (each item reads r[i] before writing dx[i], and no other item touches index i).
struct PoolBackward {
  PoolPlan plan;
  const float* dy;
  const float* r;
  float* dx;
  PMAPCC_HD void operator()(std::size_t i) const {
    const AvgPoolParams& p = plan.p;
    const int c = static_cast<int>(i % p.channels);
    std::size_t t = i / p.channels;
    const int ix = static_cast<int>(t % p.width);
    t /= p.width;
    const int iy = static_cast<int>(t % p.height);
    const std::size_t image = t / p.height;
    const float* dyi = dy + image * plan.g.out_height * plan.g.out_width * p.channels;
    // Windows oy with oy*sh <= iy < oy*sh + wh, likewise ox.
    const int oy_lo = iy >= p.window_h ? (iy - p.window_h) / p.stride_h + 1 : 0;
    const int oy_top = iy / p.stride_h, ox_top = ix / p.stride_w;
    const int oy_hi = oy_top < plan.g.out_height - 1 ? oy_top : plan.g.out_height - 1;
    const int ox_lo = ix >= p.window_w ? (ix - p.window_w) / p.stride_w + 1 : 0;
    const int ox_hi = ox_top < plan.g.out_width - 1 ? ox_top : plan.g.out_width - 1;
    float acc = 0.0f;
    for (int oy = oy_lo; oy <= oy_hi; ++oy) {
      for (int ox = ox_lo; ox <= ox_hi; ++ox) {
        const float g = dyi[(static_cast<std::size_t>(oy) * plan.g.out_width + ox) * p.channels + c] * plan.scale;
        // Tiled without a mask: the CPU writes the one value (keeping a -0); otherwise it adds from 0.
        acc = plan.tiled && r == nullptr ? g : acc + g;
      }
    }
    if (r != nullptr && !(r[i] > 0.0f)) acc = 0.0f;
    dx[i] = acc;
  }
};

std::size_t input_elements(const AvgPoolParams& p) {
  return static_cast<std::size_t>(p.members) * p.batch * p.height * p.width * p.channels;
}

}  // namespace

void CudaConvOps::avg_pool_forward(AvgPoolParams p, const float* x, float* y) const {
  const Exec& ex = ex_;
  require(x, "avg_pool_forward", "x");
  require(y, "avg_pool_forward", "y");
  const PoolPlan plan = make_plan(p);
  const std::size_t total = static_cast<std::size_t>(p.members) * p.batch * plan.g.out_height * plan.g.out_width *
                            p.channels;
  ex.launch(PoolForward{plan, x, y}, total);
}

void CudaConvOps::avg_pool_backward(AvgPoolParams p, const float* dy, float* dx) const {
  const Exec& ex = ex_;
  require(dy, "avg_pool_backward", "dy");
  require(dx, "avg_pool_backward", "dx");
  ex.launch(PoolBackward{make_plan(p), dy, nullptr, dx}, input_elements(p));
}

void CudaConvOps::avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx) const {
  const Exec& ex = ex_;
  require(r, "avg_pool_relu_backward", "r");
  require(dy, "avg_pool_relu_backward", "dy");
  require(dx, "avg_pool_relu_backward", "dx");
  ex.launch(PoolBackward{make_plan(p), dy, r, dx}, input_elements(p));
}

}  // namespace pmap::kernels::gpu
