// The CPU Backend (forwarding to kernels/cpu) and the backend_for() lookup.
#include "kernels/backend.h"

#include <pmap/error.h>

namespace pmap::kernels {

namespace detail {
const Backend& cuda_backend();  // kernels/cuda, or the stub that throws NotAvailable
}  // namespace detail

namespace {

class CpuBackend final : public Backend {
 public:
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
  void softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels, float* loss,
                             float* dlogits, float* probs, std::int32_t* correct) const override {
    cpu::softmax_cross_entropy(p, logits, labels, loss, dlogits, probs, correct);
  }
  void sgd_momentum_update(const SgdParams& p, std::size_t n, float* params, float* momentum,
                           const float* grads) const override {
    cpu::sgd_momentum_update(p, n, params, momentum, grads);
  }
  bool fused_relu() const override { return true; }
  void avg_pool_relu_backward(const AvgPoolParams& p, const float* r, const float* dy, float* dx) const override {
    cpu::avg_pool_relu_backward(p, r, dy, dx);
  }
};

}  // namespace

void Backend::avg_pool_relu_backward(const AvgPoolParams&, const float*, const float*, float*) const {
  throw NotAvailable("avg_pool_relu_backward: this backend has no fused ReLU (fused_relu() is false)");
}

const Backend& backend_for(DeviceKind kind) {
  static const CpuBackend cpu_backend;
  if (kind == DeviceKind::cpu) return cpu_backend;
  return detail::cuda_backend();
}

}  // namespace pmap::kernels
