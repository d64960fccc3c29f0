// CUDA element-wise ops (relu forward/backward, the SGD-momentum update) as grid-stride kernels, and the
// per-member reductions with Thrust. No FMA contraction (-fmad=false): bitwise the CPU ops' results.
#include <cmath>
#include <string>

#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>
#include <thrust/reduce.h>

#include <pmap/error.h>

#include "kernels/cuda/context.h"
#include "kernels/cuda/ops.h"

namespace pmap::kernels::gpu {
namespace {

__global__ void relu_forward_kernel(std::size_t n, const float* x, float* y) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float v = x[i];
    y[i] = v < 0.0f ? 0.0f : v;  // NaN is not < 0: it passes
  }
}

__global__ void relu_backward_kernel(std::size_t n, const float* y, const float* dy, float* dx) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  }
}

__global__ void sgd_kernel(SgdParams p, std::size_t n, float* params, float* momentum, const float* grads) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const float g = grads[i];
    const float m = p.momentum * momentum[i] + g;
    momentum[i] = m;
    params[i] -= p.nesterov ? p.learning_rate * (g + p.momentum * m) : p.learning_rate * m;
  }
}

// Element i of the flattened (M, n) input belongs to member i / n.
struct MemberOf {
  std::size_t n;
  __host__ __device__ std::size_t operator()(std::size_t i) const { return i / n; }
};
struct ToDouble {
  __host__ __device__ double operator()(float v) const { return static_cast<double>(v); }
};
struct ToFloat {
  double divisor;
  __host__ __device__ float operator()(double v) const { return static_cast<float>(v / divisor); }
};

// out[m] = (sum of member m's n values, in double) / divisor, rounded to float. Blocking (Thrust).
void member_sums(const char* op, int members, std::size_t n, const float* x, float* out, double divisor) {
  require(x, op, "x");
  require(out, op, "out");
  if (members <= 0) throw ValueError(std::string(op) + ": members must be > 0 (got " + std::to_string(members) + ")");
  if (n == 0) {
    PMAPCC_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(members) * sizeof(float), current_stream()));
    return;
  }
  const auto keys = thrust::make_transform_iterator(thrust::counting_iterator<std::size_t>(0), MemberOf{n});
  const auto values = thrust::make_transform_iterator(x, ToDouble{});
  const std::size_t total = static_cast<std::size_t>(members) * n;
  thrust::reduce_by_key(thrust::cuda::par.on(current_stream()), keys, keys + total, values,
                        thrust::make_discard_iterator(), thrust::make_transform_output_iterator(out, ToFloat{divisor}));
}

}  // namespace

void relu_forward(std::size_t n, const float* x, float* y) {
  require(x, "relu_forward", "x");
  require(y, "relu_forward", "y");
  if (n == 0) return;
  relu_forward_kernel<<<grid_for(n), kThreads, 0, current_stream()>>>(n, x, y);
  PMAPCC_CHECK_LAUNCH();
}

void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) {
  require(y, "relu_backward", "y");
  require(dy, "relu_backward", "dy");
  require(dx, "relu_backward", "dx");
  if (n == 0) return;
  relu_backward_kernel<<<grid_for(n), kThreads, 0, current_stream()>>>(n, y, dy, dx);
  PMAPCC_CHECK_LAUNCH();
}

void sgd_momentum_update(const SgdParams& p, std::size_t n, float* params, float* momentum, const float* grads) {
  require(params, "sgd_momentum_update", "params");
  require(momentum, "sgd_momentum_update", "momentum");
  require(grads, "sgd_momentum_update", "grads");
  if (!std::isfinite(p.learning_rate) || !std::isfinite(p.momentum))
    throw ValueError("sgd_momentum_update: learning_rate and momentum must be finite");
  if (n == 0) return;
  sgd_kernel<<<grid_for(n), kThreads, 0, current_stream()>>>(p, n, params, momentum, grads);
  PMAPCC_CHECK_LAUNCH();
}

void reduce_sum(int members, std::size_t n, const float* x, float* out) {
  member_sums("reduce_sum", members, n, x, out, 1.0);
}

void reduce_mean(int members, std::size_t n, const float* x, float* out) {
  if (n == 0) throw ValueError("reduce_mean: n must be > 0");
  member_sums("reduce_mean", members, n, x, out, static_cast<double>(n));
}

}  // namespace pmap::kernels::gpu
