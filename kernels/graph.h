// Graphs: a training step's device work recorded once and replayed, one launch instead of dozens. On a
// GPU a CUDA graph; in a host run of the CUDA kernels (kernels::cuda_backend_on_host) a recording of the
// same kernel launches, so the CPU checks what a captured step does; the CPU backend runs eagerly.
// While a body is being captured, allocating, blocking copies and collectives raise CaptureError
// (pmap/detail/capture.h): a replay re-runs the recorded device work only, never the C++ around it.
#pragma once

#include <functional>
#include <memory>

namespace pmap::kernels {

class Backend;

// A captured piece of device work. launch() queues it on the calling thread's current stream (GPU) or
// runs it (host run). Asynchronous on GPUs, like the ops.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void launch() = 0;
};

// Runs a step body through a backend's graphs: the first call runs it eagerly (the warm-up that creates
// handles and checks it), the second captures it and launches the capture, later calls launch the
// capture. Every pointer and size the body uses is fixed in the capture: a new buffer or shape needs a
// new StepGraph (or reset()). On a backend that does not capture (CPU), or with capture false, every call
// runs the body.
class StepGraph {
 public:
  explicit StepGraph(const Backend& backend, bool capture = true) : backend_(&backend), capture_(capture) {}
  void run(const std::function<void()>& body);
  bool captured() const { return graph_ != nullptr; }
  void reset() noexcept;

 private:
  const Backend* backend_;
  bool capture_;
  bool warmed_ = false;
  std::unique_ptr<Graph> graph_;
};

}  // namespace pmap::kernels
