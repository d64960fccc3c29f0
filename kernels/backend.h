// Backend: the numeric ops of kernels/ops.h behind one interface, so the training layer runs the same
// step on CPU devices (Eigen) and CUDA devices. Every pointer is in the memory of the backend's device
// (host memory for the CPU backend and for the CUDA backend run on the host). CPU: every call completes
// before it returns. CUDA on a GPU: every call is queued on the calling thread's current stream and
// returns at once; nothing allocates (given workspaces) and nothing waits for the GPU, so a step can be
// captured in a graph (kernels/graph.h) and its results read later, after the stream is synchronized
// (pmap does that when the pmapped function returns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <pmap/device.h>

#include "kernels/graph.h"
#include "kernels/ops.h"

namespace pmap::kernels {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda", "cuda-on-host"
  virtual DeviceKind kind() const = 0;   // the kind of device whose memory the pointers are in

  virtual std::size_t conv2d_workspace_bytes(const Conv2dParams& p) const = 0;
  virtual void conv2d_forward(const Conv2dParams& p, const float* x, const float* w, const float* b, float* y,
                              void* workspace) const = 0;
  virtual void conv2d_backward(const Conv2dParams& p, const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db, void* workspace) const = 0;
  virtual void avg_pool_forward(const AvgPoolParams& p, const float* x, float* y) const = 0;
  virtual void avg_pool_backward(const AvgPoolParams& p, const float* dy, float* dx) const = 0;
  virtual void avg_pool_relu_backward(const AvgPoolParams& p, const float* r, const float* dy, float* dx) const = 0;
  virtual std::size_t dense_workspace_bytes(const DenseParams& p) const = 0;
  virtual void dense_forward(const DenseParams& p, const float* x, const float* w, const float* b, float* y,
                             void* workspace) const = 0;
  virtual void dense_backward(const DenseParams& p, const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* db, void* workspace) const = 0;
  virtual void relu_forward(std::size_t n, const float* x, float* y) const = 0;
  virtual void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const = 0;

  virtual std::size_t softmax_cross_entropy_workspace_bytes(const SoftmaxXentParams& p) const = 0;
  // loss (M) and correct (M) are written on the device. A label outside [0, K): the CPU backend raises
  // ValueError; the CUDA backend skips the row and adds it to *bad_labels (device i32, optional), which
  // the caller checks when it reads its results.
  virtual void softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels,
                                     float* loss, float* dlogits, float* probs, std::int32_t* correct,
                                     std::int32_t* bad_labels, void* workspace) const = 0;
  virtual void sgd_momentum_update(const SgdParams& p, std::size_t n, float* params, float* momentum,
                                   const float* grads) const = 0;

  // The ensemble step's reductions (kernels/ops.h: cpu::sum_members, ...).
  virtual void sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) const = 0;
  virtual void divide(std::size_t n, float* x, float divisor) const = 0;
  virtual void argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels,
                           std::int32_t* hits) const = 0;
  virtual void accumulate_metrics(int count, const float* loss, const std::int32_t* correct, double rows,
                                  double* loss_sum, std::int32_t* hits) const = 0;
  virtual void mean_from_sums(int count, const double* sums, double divisor, float* out) const = 0;
  virtual std::size_t calibration_workspace_bytes(const CalibrationParams& p) const = 0;
  // sums (predictors, kCalibrationSlots) f64 += the calibration sums of probs (kernels/ops.h). A label out
  // of range: the CPU raises ValueError, CUDA leaves the row out.
  virtual void calibration_sums(const CalibrationParams& p, const float* probs, const std::int32_t* labels,
                                double* sums, void* workspace) const = 0;
  virtual void predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                           float* entropy) const = 0;

  // Memory of the device, ordered with the backend's other work: a copy within it, zero bytes.
  virtual void copy(void* dst, const void* src, std::size_t bytes) const = 0;
  virtual void fill_zero(void* dst, std::size_t bytes) const = 0;

  // Creates what the calling thread's work needs later (cuBLAS handles on its stream), so that steps
  // allocate nothing. Call on the thread (pmap worker) that will run the ops.
  virtual void prepare() const {}
  // Whether capture() records graphs; when false, StepGraph runs bodies eagerly.
  virtual bool captures() const { return false; }
  // A graph of body's work on the calling thread (see kernels/graph.h).
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& body) const;
};

// The backend of a device kind: the CPU ops, or the CUDA ops on the calling thread's GPU stream. The CUDA
// one throws NotAvailable in builds without CUDA.
const Backend& backend_for(DeviceKind kind);

// The CUDA backend run on the host: every CUDA kernel executed over its launch grid by the host launcher,
// the GEMMs by a host GEMM taking cuBLAS's column-major arguments, graphs recorded and replayed, on host
// memory (CPU devices). For checking the CUDA code where there is no GPU; much slower than the CPU ops.
const Backend& cuda_backend_on_host();

// "cuBLAS 13.1.0" (the library loaded), or "" in builds without CUDA. For logs; never throws.
std::string cublas_version();

}  // namespace pmap::kernels
