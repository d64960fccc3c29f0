// The CPU Backend (forwarding to kernels/cpu), the backend_for() lookup, and StepGraph.
#include "kernels/backend.h"

#include <cstring>

#include <pmap/error.h>

namespace pmap::kernels {

namespace detail {
const Backend& cuda_backend();  // kernels/cuda/backend.cu, or the stub that throws NotAvailable
}  // namespace detail

namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::size_t conv2d_workspace_bytes(const Conv2dParams& p) const override { return cpu::conv2d_workspace_bytes(p); }
  void conv2d_forward(const Conv2dParams& p, const float* x, const float* w, const float* b, float* y,
                      void* ws) const override {
    cpu::conv2d_forward(p, x, w, b, y, ws);
  }
  void conv2d_backward(const Conv2dParams& p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, void* ws) const override {
    cpu::conv2d_backward(p, x, w, dy, dx, dw, db, ws);
  }
  void avg_pool_forward(const AvgPoolParams& p, const float* x, float* y) const override {
    cpu::avg_pool_forward(p, x, y);
  }
  void avg_pool_backward(const AvgPoolParams& p, const float* dy, float* dx) const override {
    cpu::avg_pool_backward(p, dy, dx);
  }
  void avg_pool_relu_backward(const AvgPoolParams& p, const float* r, const float* dy, float* dx) const override {
    cpu::avg_pool_relu_backward(p, r, dy, dx);
  }
  std::size_t dense_workspace_bytes(const DenseParams& p) const override { return cpu::dense_workspace_bytes(p); }
  void dense_forward(const DenseParams& p, const float* x, const float* w, const float* b, float* y,
                     void* ws) const override {
    cpu::dense_forward(p, x, w, b, y, ws);
  }
  void dense_backward(const DenseParams& p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, void* ws) const override {
    cpu::dense_backward(p, x, w, dy, dx, dw, db, ws);
  }
  void relu_forward(std::size_t n, const float* x, float* y) const override { cpu::relu_forward(n, x, y); }
  void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const override {
    cpu::relu_backward(n, y, dy, dx);
  }
  std::size_t softmax_cross_entropy_workspace_bytes(const SoftmaxXentParams& p) const override {
    validate(p);
    return 0;
  }
  void softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels, float* loss,
                             float* dlogits, float* probs, std::int32_t* correct, std::int32_t*,
                             void*) const override {
    cpu::softmax_cross_entropy(p, logits, labels, loss, dlogits, probs, correct);  // raises on a bad label
  }
  void sgd_momentum_update(const SgdParams& p, std::size_t n, float* params, float* momentum,
                           const float* grads) const override {
    cpu::sgd_momentum_update(p, n, params, momentum, grads);
  }
  void sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) const override {
    cpu::sum_members(count, n, x, out, accumulate);
  }
  void divide(std::size_t n, float* x, float divisor) const override { cpu::divide(n, x, divisor); }
  void argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels,
                   std::int32_t* hits) const override {
    cpu::argmax_hits(rows, classes, scores, labels, hits);
  }
  void accumulate_metrics(int count, const float* loss, const std::int32_t* correct, double rows, double* loss_sum,
                          std::int32_t* hits) const override {
    cpu::accumulate_metrics(count, loss, correct, rows, loss_sum, hits);
  }
  void mean_from_sums(int count, const double* sums, double divisor, float* out) const override {
    cpu::mean_from_sums(count, sums, divisor, out);
  }
  std::size_t calibration_workspace_bytes(const CalibrationParams& p) const override {
    validate(p);
    return 0;
  }
  void calibration_sums(const CalibrationParams& p, const float* probs, const std::int32_t* labels, double* sums,
                        void*) const override {
    cpu::calibration_sums(p, probs, labels, sums);
  }
  void predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                   float* entropy) const override {
    cpu::predictions(rows, classes, probs, predicted, probability, entropy);
  }
  void copy(void* dst, const void* src, std::size_t bytes) const override {
    if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* dst, std::size_t bytes) const override {
    if (bytes != 0) std::memset(dst, 0, bytes);
  }
};

}  // namespace

std::unique_ptr<Graph> Backend::capture(const std::function<void()>&) const {
  throw NotAvailable("the " + name() + " backend does not capture graphs (captures() is false)");
}

const Backend& backend_for(DeviceKind kind) {
  static const CpuBackend cpu_backend;
  if (kind == DeviceKind::cpu) return cpu_backend;
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
