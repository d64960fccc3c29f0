// GraphStep: captures a callable's GPU work on the current stream into a CUDA graph once, then replays the
// graph on later calls: one launch instead of dozens of kernel and cuBLAS launches per training step.
//
// What the captured callable must respect (a replay re-runs the recorded GPU work, never the C++ code):
//   - Fixed pointers and shapes: every buffer it touches, and every size, is baked into the graph. Buffers
//     must outlive the GraphStep; new shapes or buffers need reset() (or a new GraphStep).
//   - No host synchronization: no cudaStreamSynchronize / cudaDeviceSynchronize, no blocking copies, no
//     reading device results on the host (kernels::Backend::softmax_cross_entropy does; capture
//     kernels::gpu::softmax_cross_entropy with device outputs and copy them to pinned host memory with
//     cudaMemcpyAsync instead), no pmapcc collectives (they meet the other devices on the host).
//   - No allocation: the body must have run once before it is captured, so cuBLAS handles and scratch
//     memory exist (GraphStep runs it eagerly on its first call and captures on the second).
//   - Host side effects (counters, logging) happen once, at capture, not on replays.
//   - Host inputs reach the graph through fixed pinned buffers: write them before calling, then the
//     captured cudaMemcpyAsync copies them in.
// Calls are asynchronous with respect to the host, like the ops; the stream must not be the legacy default
// stream (run inside pmap, or under a pmap::detail::StreamScope).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

namespace pmap::kernels::gpu {

class GraphStep {
 public:
  explicit GraphStep(std::function<void()> body) : body_(std::move(body)) {}
  ~GraphStep();  // never throws
  GraphStep(const GraphStep&) = delete;
  GraphStep& operator=(const GraphStep&) = delete;

  // Does the body's GPU work once per call, on the current stream. First call: runs the body eagerly (the
  // warm-up that creates handles and scratch). Second call: captures the body into a graph and launches
  // it. Later calls: launch the graph, on a stream of the GPU it was captured on. Asynchronous.
  void operator()();
  // Drops the graph: the next call captures again (after a change of buffers or shapes).
  void reset() noexcept;
  bool captured() const { return exec_ != nullptr; }

 private:
  void capture();

  std::function<void()> body_;
  bool warmed_ = false;
  cudaGraphExec_t exec_ = nullptr;
  int device_ = -1;
};

}  // namespace pmap::kernels::gpu
