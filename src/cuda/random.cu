// Device samplers: the host samplers of src/random.cpp as one kernel, built on the same per-element math
// (pmap/detail/philox.h) and compiled with -fmad=false, so a key draws the same numbers on CPU and GPU:
// bitwise for bits, uniform, bernoulli and truncated normal; to a few ulp for normal (CUDA's logf / sinf /
// cosf are not glibc's).
#include <cuda_runtime.h>

#include <cstdint>

#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/detail/philox.h>

#include "backend.h"

namespace pmap::detail {
namespace {

constexpr int kThreads = 256;

// What one launch draws; element i is word i % 4 of Philox block i / 4 of the key's stream.
struct SampleParams {
  SampleKind kind;
  std::uint64_t seed;
  float a, b;
  TruncatedNormalParams truncated;
  void* out;
  std::size_t count;
};

// Writes the `valid` (1..4) elements of block `block` for the requested distribution.
__device__ void write_block(const SampleParams& p, const Philox4& w, std::size_t first, int valid) {
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

// One thread per Philox block (4 elements), grid-stride.
__global__ void sample_kernel(SampleParams p) {
  const std::size_t blocks = (p.count + 3) / 4;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t b = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; b < blocks; b += stride) {
    const std::size_t first = b * 4;
    const std::size_t left = p.count - first;
    write_block(p, curand_host_block(p.seed, b), first, left < 4 ? static_cast<int>(left) : 4);
  }
}

}  // namespace

void cuda_sample(const SampleRequest& request) {
  if (request.count == 0) return;
  DeviceScope scope(request.ordinal);
  const cudaStream_t stream = stream_for_gpu(request.ordinal);
  SampleParams p{};
  p.kind = request.kind;
  p.seed = philox_seed(request.key);
  p.a = request.a;
  p.b = request.b;
  if (request.kind == SampleKind::truncated_normal) p.truncated = truncated_normal_params(request.a, request.b);
  p.out = request.out;
  p.count = request.count;
  const std::size_t blocks = (request.count + 3) / 4;
  const std::size_t grid = (blocks + kThreads - 1) / kThreads;
  sample_kernel<<<static_cast<unsigned>(grid < 8192 ? grid : 8192), kThreads, 0, stream>>>(p);
  PMAPCC_CHECK_LAUNCH();
  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace pmap::detail
