// The CUDA Backend: kernels::Backend over the ops of kernels/cuda/ops.h. Every op is queued on the
// calling thread's current stream; softmax_cross_entropy, which hands loss and correct counts to the
// host, synchronizes that stream.
#include <string>

#include <pmap/error.h>

#include "kernels/backend.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops.h"

namespace pmap::kernels {
namespace {

// Device copies of what the loss hands to the host: M losses, M counts, one bad-label count.
struct XentResults {
  float* loss;
  std::int32_t* correct;
  std::int32_t* bad_labels;
};

XentResults xent_results(int members) {
  const std::size_t m = static_cast<std::size_t>(members);
  auto* base = static_cast<unsigned char*>(gpu::scratch(m * sizeof(float) + (m + 1) * sizeof(std::int32_t)));
  auto* correct = reinterpret_cast<std::int32_t*>(base + m * sizeof(float));
  return XentResults{reinterpret_cast<float*>(base), correct, correct + m};
}

class CudaBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::size_t conv2d_workspace_bytes(const Conv2dParams& p) const override { return gpu::conv2d_workspace_bytes(p); }
  void conv2d_forward(const Conv2dParams& p, const float* x, const float* w, const float* b, float* y,
                      void* ws) const override {
    gpu::conv2d_forward(p, x, w, b, y, ws);
  }
  void conv2d_backward(const Conv2dParams& p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, void* ws) const override {
    gpu::conv2d_backward(p, x, w, dy, dx, dw, db, ws);
  }
  void avg_pool_forward(const AvgPoolParams& p, const float* x, float* y) const override {
    gpu::avg_pool_forward(p, x, y);
  }
  void avg_pool_backward(const AvgPoolParams& p, const float* dy, float* dx) const override {
    gpu::avg_pool_backward(p, dy, dx);
  }
  std::size_t dense_workspace_bytes(const DenseParams& p) const override { return gpu::dense_workspace_bytes(p); }
  void dense_forward(const DenseParams& p, const float* x, const float* w, const float* b, float* y,
                     void* ws) const override {
    gpu::dense_forward(p, x, w, b, y, ws);
  }
  void dense_backward(const DenseParams& p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, void* ws) const override {
    gpu::dense_backward(p, x, w, dy, dx, dw, db, ws);
  }
  void relu_forward(std::size_t n, const float* x, float* y) const override { gpu::relu_forward(n, x, y); }
  void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const override {
    gpu::relu_backward(n, y, dy, dx);
  }
  // loss and correct are host pointers; the stream is synchronized before they are written.
  void softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels, float* loss,
                             float* dlogits, float* probs, std::int32_t* correct) const override;
  void sgd_momentum_update(const SgdParams& p, std::size_t n, float* params, float* momentum,
                           const float* grads) const override {
    gpu::sgd_momentum_update(p, n, params, momentum, grads);
  }
};

void CudaBackend::softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels,
                                        float* loss, float* dlogits, float* probs, std::int32_t* correct) const {
  validate(p);
  const cudaStream_t stream = gpu::current_stream();
  const XentResults dev = xent_results(p.members);
  PMAPCC_CUDA_CHECK(cudaMemsetAsync(dev.bad_labels, 0, sizeof(std::int32_t), stream));
  gpu::softmax_cross_entropy(p, logits, labels, loss == nullptr ? nullptr : dev.loss, dlogits, probs,
                             correct == nullptr ? nullptr : dev.correct, dev.bad_labels);
  if (labels == nullptr) return;  // probabilities only: nothing for the host
  const std::size_t m = static_cast<std::size_t>(p.members);
  std::int32_t bad = 0;
  if (loss != nullptr) PMAPCC_CUDA_CHECK(cudaMemcpyAsync(loss, dev.loss, m * sizeof(float), cudaMemcpyDeviceToHost, stream));
  if (correct != nullptr) {
    PMAPCC_CUDA_CHECK(cudaMemcpyAsync(correct, dev.correct, m * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream));
  }
  PMAPCC_CUDA_CHECK(cudaMemcpyAsync(&bad, dev.bad_labels, sizeof(bad), cudaMemcpyDeviceToHost, stream));
  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bad != 0) {
    throw ValueError("softmax_cross_entropy: " + std::to_string(bad) + " label(s) outside [0, " +
                     std::to_string(p.classes) + ")");
  }
}

}  // namespace

namespace detail {

const Backend& cuda_backend() {
  static const CudaBackend backend;
  return backend;
}

}  // namespace detail
}  // namespace pmap::kernels
