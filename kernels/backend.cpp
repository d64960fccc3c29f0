// The backend_for() lookup, and StepGraph.
#include <pmapcc/kernels/backend.h>

#include <pmap/error.h>

#include <pmapcc/kernels/cpu_backend.h>

namespace pmap::kernels {

namespace detail {
const Backend& cuda_backend();  // kernels/cuda/backend.cu, or the stub that throws NotAvailable
}  // namespace detail

std::unique_ptr<Graph> Backend::capture(const std::function<void()>&) const {
  throw NotAvailable("the " + name() + " backend does not capture graphs (captures() is false)");
}

const Backend& backend_for(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return cpu_backend();
  return detail::cuda_backend();
}

void StepGraph::run(const std::function<void()>& body) {
  if (!capture_ || !backend_->captures() || !warmed_) {
    body();
    warmed_ = true;
    return;
  }
  if (graph_ == nullptr) graph_ = backend_->capture(body);
  graph_->launch();
}

void StepGraph::reset() noexcept {
  graph_.reset();
  warmed_ = false;
}

}  // namespace pmap::kernels
