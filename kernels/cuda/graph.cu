// GraphStep: warm-up, capture on the current stream (thread-local capture mode, so other threads' CUDA
// calls are unaffected), instantiation and replay.
#include "kernels/cuda/graph.h"

#include <exception>

#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/error.h>

namespace pmap::kernels::gpu {

GraphStep::~GraphStep() { reset(); }

void GraphStep::reset() noexcept {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
  device_ = -1;
}

void GraphStep::capture() {
  const cudaStream_t stream = detail::current_stream();
  if (stream == nullptr) {
    throw ValueError("GraphStep: the legacy default stream cannot be captured; run inside pmap or under a "
                     "pmap::detail::StreamScope");
  }
  PMAPCC_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    body_();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  PMAPCC_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    exec_ = nullptr;
    detail::throw_cuda_error(made, detail::CheckSite{"cudaGraphInstantiate(&exec_, graph, 0)", __FILE__, __LINE__});
  }
  PMAPCC_CUDA_CHECK(cudaGetDevice(&device_));
}

void GraphStep::operator()() {
  if (!warmed_) {
    body_();
    warmed_ = true;
    return;
  }
  if (exec_ == nullptr) capture();
  int device = -1;
  PMAPCC_CUDA_CHECK(cudaGetDevice(&device));
  if (device != device_) {
    throw ValueError("GraphStep: captured on GPU " + std::to_string(device_) + ", launched on GPU " +
                     std::to_string(device));
  }
  PMAPCC_CUDA_CHECK(cudaGraphLaunch(exec_, detail::current_stream()));
}

}  // namespace pmap::kernels::gpu
