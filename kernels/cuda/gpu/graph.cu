// CUDA-graph capture of a step (Exec::capture on a GPU): capture of the current stream in thread-local mode
// (other threads' CUDA calls are unaffected; the mode NCCL asks for with one thread per GPU), under the
// runtime's capture guard, so that an allocation, a copy through the host or a collective the capturer
// cannot record (pmap/detail/capture.h) raises CaptureError naming it rather than a CUDA error.
#include <cuda_runtime_api.h>

#include <pmap/detail/capture.h>
#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/error.h>

#include <pmapcc/kernels/cuda/gpu/native.h>
#include <pmapcc/kernels/graph.h>

namespace pmap::kernels::gpu::native {
namespace {

class CudaGraph final : public Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, int device) : exec_(exec), device_(device) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void launch() override {
    int device = -1;
    PMAPCC_CUDA_CHECK(cudaGetDevice(&device));
    if (device != device_)
      throw ValueError("a CUDA graph captured on GPU " + std::to_string(device_) + " was launched on GPU " +
                       std::to_string(device));
    PMAPCC_CUDA_CHECK(cudaGraphLaunch(exec_, pmap::detail::current_stream()));
  }

 private:
  cudaGraphExec_t exec_;
  int device_;
};

}  // namespace

std::unique_ptr<Graph> capture(const std::function<void()>& body) {
  const cudaStream_t stream = pmap::detail::current_stream();
  if (stream == nullptr)
    throw ValueError("graph capture: the legacy default stream cannot be captured; run inside pmap or under a "
                     "pmap::detail::StreamScope");
  PMAPCC_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  // The scope ends after cudaStreamEndCapture, on every path: memory freed in the body is released then.
  pmap::detail::CaptureScope scope("the capture of a step into a CUDA graph");
  try {
    body();
    scope.check();  // what the body could not raise where it happened (an Array freed): before EndCapture
  } catch (...) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  PMAPCC_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess)
    pmap::detail::throw_cuda_error(made, pmap::detail::CheckSite{"cudaGraphInstantiate(&exec, graph, 0)", __FILE__, __LINE__});
  int device = -1;
  PMAPCC_CUDA_CHECK(cudaGetDevice(&device));
  return std::make_unique<CudaGraph>(exec, device);
}

}  // namespace pmap::kernels::gpu::native
