// Device samplers: the host samplers of src/random.cpp as one kernel (SampleBlocks, src/device_kernels.h),
// built on the same per-element math (pmap/detail/philox.h) and compiled with -fmad=false, so a key draws
// the same numbers on CPU and GPU: bitwise for bits, uniform, bernoulli and truncated normal; to a few ulp
// for normal (CUDA's logf / sinf / cosf are not glibc's).
#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/detail/launch_gpu.cuh>

#include "cuda_seam.h"
#include "device_kernels.h"

namespace pmap::detail {

void cuda_sample(const SampleRequest& request) {
  if (request.count == 0) return;
  DeviceScope scope(request.ordinal);
  const cudaStream_t stream = stream_for_gpu(request.ordinal);
  gpu_launch(SampleBlocks{sample_params(request)}, sample_items(request.count), sample_grid(request.count), stream);
  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace pmap::detail
