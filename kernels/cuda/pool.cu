// CUDA average pooling (VALID, any window and stride), forward and backward, one thread per output
// (forward) or input (backward) element. The sums run in the CPU's order without FMA, so the results are
// bitwise those of the CPU ops.
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops.h"

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
__global__ void pool_forward_kernel(PoolPlan plan, const float* x, float* y, std::size_t total) {
  const AvgPoolParams& p = plan.p;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total; i += stride) {
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
}

// dx (images, H, W, C): the sum over the windows holding the pixel (output pixels ascending) of
// dy * scale; 0 outside every window.
__global__ void pool_backward_kernel(PoolPlan plan, const float* dy, float* dx, std::size_t total) {
  const AvgPoolParams& p = plan.p;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total; i += stride) {
    const int c = static_cast<int>(i % p.channels);
    std::size_t t = i / p.channels;
    const int ix = static_cast<int>(t % p.width);
    t /= p.width;
    const int iy = static_cast<int>(t % p.height);
    const std::size_t image = t / p.height;
    const float* dyi = dy + image * plan.g.out_height * plan.g.out_width * p.channels;
    // Windows oy with oy*sh <= iy < oy*sh + wh, likewise ox.
    const int oy_lo = iy >= p.window_h ? (iy - p.window_h) / p.stride_h + 1 : 0;
    const int oy_hi = min(iy / p.stride_h, plan.g.out_height - 1);
    const int ox_lo = ix >= p.window_w ? (ix - p.window_w) / p.stride_w + 1 : 0;
    const int ox_hi = min(ix / p.stride_w, plan.g.out_width - 1);
    float acc = 0.0f;
    for (int oy = oy_lo; oy <= oy_hi; ++oy) {
      for (int ox = ox_lo; ox <= ox_hi; ++ox) {
        const float g = dyi[(static_cast<std::size_t>(oy) * plan.g.out_width + ox) * p.channels + c] * plan.scale;
        acc = plan.tiled ? g : acc + g;  // tiled: the CPU writes the one value (keeps a -0)
      }
    }
    dx[i] = acc;
  }
}

}  // namespace

void avg_pool_forward(const AvgPoolParams& p, const float* x, float* y) {
  require(x, "avg_pool_forward", "x");
  require(y, "avg_pool_forward", "y");
  const PoolPlan plan = make_plan(p);
  const std::size_t total = static_cast<std::size_t>(p.members) * p.batch * plan.g.out_height * plan.g.out_width *
                            p.channels;
  pool_forward_kernel<<<grid_for(total), kThreads, 0, current_stream()>>>(plan, x, y, total);
  PMAPCC_CHECK_LAUNCH();
}

void avg_pool_backward(const AvgPoolParams& p, const float* dy, float* dx) {
  require(dy, "avg_pool_backward", "dy");
  require(dx, "avg_pool_backward", "dx");
  const PoolPlan plan = make_plan(p);
  const std::size_t total = static_cast<std::size_t>(p.members) * p.batch * p.height * p.width * p.channels;
  pool_backward_kernel<<<grid_for(total), kThreads, 0, current_stream()>>>(plan, dy, dx, total);
  PMAPCC_CHECK_LAUNCH();
}

}  // namespace pmap::kernels::gpu
