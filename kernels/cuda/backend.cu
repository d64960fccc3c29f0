// The CUDA Backend: kernels::Backend over the ops of kernels/cuda/ops.h, once on the GPU (Exec::gpu(): the
// calling thread's current stream; nothing waits for the GPU) and once on the host (Exec::host():
// cuda_backend_on_host, how the CUDA code is checked without a GPU). Graph capture: CUDA graphs on the GPU,
// recordings of the host run.
#include <pmap/error.h>

#include "kernels/backend.h"
#include "kernels/cuda/gpu/native.h"
#include "kernels/cuda/ops.h"

namespace pmap::kernels {
namespace {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(gpu::Exec ex) : ex_(ex) {}
  std::string name() const override { return ex_.on_host() ? "cuda-on-host" : "cuda"; }
  DeviceKind kind() const override { return ex_.on_host() ? DeviceKind::cpu : DeviceKind::cuda; }
  std::size_t conv2d_workspace_bytes(const Conv2dParams& p) const override { return gpu::conv2d_workspace_bytes(p); }
  void conv2d_forward(const Conv2dParams& p, const float* x, const float* w, const float* b, float* y,
                      void* ws) const override {
    gpu::conv2d_forward(ex_, p, x, w, b, y, ws);
  }
  void conv2d_backward(const Conv2dParams& p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, void* ws) const override {
    gpu::conv2d_backward(ex_, p, x, w, dy, dx, dw, db, ws);
  }
  void avg_pool_forward(const AvgPoolParams& p, const float* x, float* y) const override {
    gpu::avg_pool_forward(ex_, p, x, y);
  }
  void avg_pool_backward(const AvgPoolParams& p, const float* dy, float* dx) const override {
    gpu::avg_pool_backward(ex_, p, dy, dx);
  }
  void avg_pool_relu_backward(const AvgPoolParams& p, const float* r, const float* dy, float* dx) const override {
    gpu::avg_pool_relu_backward(ex_, p, r, dy, dx);
  }
  std::size_t dense_workspace_bytes(const DenseParams& p) const override { return gpu::dense_workspace_bytes(p); }
  void dense_forward(const DenseParams& p, const float* x, const float* w, const float* b, float* y,
                     void* ws) const override {
    gpu::dense_forward(ex_, p, x, w, b, y, ws);
  }
  void dense_backward(const DenseParams& p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, void* ws) const override {
    gpu::dense_backward(ex_, p, x, w, dy, dx, dw, db, ws);
  }
  void relu_forward(std::size_t n, const float* x, float* y) const override { gpu::relu_forward(ex_, n, x, y); }
  void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const override {
    gpu::relu_backward(ex_, n, y, dy, dx);
  }
  std::size_t softmax_cross_entropy_workspace_bytes(const SoftmaxXentParams& p) const override {
    return gpu::softmax_cross_entropy_workspace_bytes(p);
  }
  void softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels, float* loss,
                             float* dlogits, float* probs, std::int32_t* correct, std::int32_t* bad_labels,
                             void* ws) const override {
    gpu::softmax_cross_entropy(ex_, p, logits, labels, loss, dlogits, probs, correct, bad_labels, ws);
  }
  void sgd_momentum_update(const SgdParams& p, std::size_t n, float* params, float* momentum,
                           const float* grads) const override {
    gpu::sgd_momentum_update(ex_, p, n, params, momentum, grads);
  }
  void sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) const override {
    gpu::sum_members(ex_, count, n, x, out, accumulate);
  }
  void divide(std::size_t n, float* x, float divisor) const override { gpu::divide(ex_, n, x, divisor); }
  void argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels,
                   std::int32_t* hits) const override {
    gpu::argmax_hits(ex_, rows, classes, scores, labels, hits);
  }
  void accumulate_metrics(int count, const float* loss, const std::int32_t* correct, double rows, double* loss_sum,
                          std::int32_t* hits) const override {
    gpu::accumulate_metrics(ex_, count, loss, correct, rows, loss_sum, hits);
  }
  void mean_from_sums(int count, const double* sums, double divisor, float* out) const override {
    gpu::mean_from_sums(ex_, count, sums, divisor, out);
  }
  std::size_t calibration_workspace_bytes(const CalibrationParams& p) const override {
    return gpu::calibration_workspace_bytes(p);
  }
  void calibration_sums(const CalibrationParams& p, const float* probs, const std::int32_t* labels, double* sums,
                        void* ws) const override {
    gpu::calibration_sums(ex_, p, probs, labels, sums, ws);
  }
  void predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                   float* entropy) const override {
    gpu::predictions(ex_, rows, classes, probs, predicted, probability, entropy);
  }
  void copy(void* dst, const void* src, std::size_t bytes) const override { ex_.copy(dst, src, bytes); }
  void fill_zero(void* dst, std::size_t bytes) const override { ex_.fill_zero(dst, bytes); }
  void prepare() const override { ex_.prepare(); }
  bool captures() const override { return true; }
  std::unique_ptr<Graph> capture(const std::function<void()>& body) const override { return ex_.capture(body); }

 private:
  gpu::Exec ex_;
};

}  // namespace

namespace detail {

const Backend& cuda_backend() {
  if (!gpu::native::built())
    throw NotAvailable("the CUDA kernels were built for host runs only (PMAPCC_WITH_CUDA=OFF or no CUDA toolkit)");
  static const CudaBackend backend(gpu::Exec::gpu());
  return backend;
}

}  // namespace detail

std::string cublas_version() { return gpu::native::cublas_version(); }

const Backend& cuda_backend_on_host() {
  static const CudaBackend backend(gpu::Exec::host());
  return backend;
}

}  // namespace pmap::kernels
