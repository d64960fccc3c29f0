// pmap_cuda_kernel: a kernel of your own inside pmap. Each GPU (or virtual device) of a 1-D mesh fills its
// block with a CUDA kernel launched on pmap::cuda_stream(), the device's stream, so it runs in order with
// pmapcc's work there: ops::sum reads what the kernel wrote and psum adds the devices' sums. Built with CUDA
// only; it needs a GPU to run (without one it says so and exits 1).
//
//   pmap_cuda_kernel [devices]   (default: one per GPU; more than the GPUs share them as virtual devices)
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <pmap/pmap.h>
#include <pmapcc/core/ops.h>

namespace {

// y[i] = (device + 1) * i for i in [0, n).
__global__ void ramp(float* y, long long n, float scale) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    y[i] = scale * static_cast<float>(i);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int n = argc > 1 ? std::atoi(argv[1]) : -1;
    pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cuda, n), "i");
    std::printf("%s\n", mesh.str().c_str());
    constexpr long long kSize = 1 << 20;
    auto sums = pmap::pmap([&] {
      pmap::Array y(pmap::Shape{kSize}, pmap::DType::f32, pmap::current_device());
      auto stream = static_cast<cudaStream_t>(pmap::cuda_stream());
      const float scale = static_cast<float>(pmap::axis_index("i") + 1);
      ramp<<<256, 256, 0, stream>>>(y.data<float>(), kSize, scale);
      if (cudaGetLastError() != cudaSuccess) throw pmap::Error("the ramp kernel did not launch");
      return pmap::psum(pmap::ops::sum(y), "i").item<float>();  // queued after the kernel on the same stream
    }, mesh, "i")();
    // sum over devices d of (d + 1) * (0 + 1 + ... + kSize - 1)
    const double devices = static_cast<double>(mesh.size());
    const double want = devices * (devices + 1) / 2 * (static_cast<double>(kSize) * (kSize - 1) / 2);
    std::printf("sum %.6g, expected %.6g\n", static_cast<double>(sums[0]), want);
    return std::abs(sums[0] - want) <= 1e-5 * want ? 0 : 1;
  } catch (const pmap::Error& e) {
    std::fprintf(stderr, "pmap_cuda_kernel: %s\n", e.what());
    return 1;
  }
}
