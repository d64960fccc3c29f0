// The two CUDA backends (kernels/cuda/backend.h): on the GPU (Exec::gpu(): the calling thread's current
// stream; nothing waits for the GPU) and on the host (Exec::host(): cuda_backend_on_host, how the CUDA
// code is checked without a GPU). Graph capture: CUDA graphs on the GPU, recordings of the host run.
#include <pmapcc/kernels/cuda/backend.h>

#include <pmap/error.h>

#include <pmapcc/kernels/cuda/gpu/native.h>

namespace pmap::kernels {

namespace detail {

const Backend& cuda_backend() {
  if (!gpu::native::built())
    throw NotAvailable("the CUDA kernels were built for host runs only (PMAPCC_WITH_CUDA=OFF or no CUDA toolkit)");
  static const gpu::CudaBackend backend(gpu::Exec::gpu());
  return backend;
}

}  // namespace detail

std::string cublas_version() { return gpu::native::cublas_version(); }

const Backend& cuda_backend_on_host() {
  static const gpu::CudaBackend backend(gpu::Exec::host());
  return backend;
}

}  // namespace pmap::kernels
