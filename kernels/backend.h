// Backend: the numeric ops of the MNIST CNN behind one interface, so the training layer runs the same step
// on CPU devices and CUDA devices. There is one dispatch, this class's virtual call: each CPU ISA variant
// is a Backend of its own (kernels/cpu_backend.h), and so is the CUDA code (kernels/cuda/backend.h).
//
// Every pointer is in the memory of the backend's device (host memory for the CPU backends and for the
// CUDA backend run on the host). CPU: every call completes before it returns. CUDA on a GPU: every call is
// queued on the calling thread's current stream and returns at once; nothing allocates (given workspaces)
// and nothing waits for the GPU, so a step can be captured in a graph (kernels/graph.h) and its results
// read later, after the stream is synchronized (pmap does that when the pmapped function returns).
//
// Shapes, layouts and parameter structs are kernels/ops.h's. Outputs never alias inputs unless the op
// says so. Gradients are written (overwritten), never accumulated into. Bad parameters throw
// pmap::ValueError naming the field; a required pointer that is null throws pmap::ValueError naming it.
// Results do not depend on M or on the workspace: member m of a call with M members is bitwise equal to a
// call with that member alone (a shared input's dx, a sum over members, excepted: it equals the sum to
// rounding). The CUDA ops agree with the CPU ops to ~1e-6 relative on a GPU (cuBLAS sums in another
// order); the element-wise ops and the ensemble step's reductions are bitwise equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <pmap/device.h>

#include <pmapcc/kernels/graph.h>
#include <pmapcc/kernels/ops.h>
#include <pmapcc/kernels/layer_ops.h>
#include <pmapcc/kernels/metric_ops.h>
#include <pmapcc/kernels/optimizer_ops.h>

namespace pmap::kernels {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda", "cuda-on-host"
  virtual DeviceKind kind() const = 0;   // the kind of device whose memory the pointers are in

  // ---- conv2d -------------------------------------------------------------------------------------------

  // Bytes of scratch memory conv2d_forward and conv2d_backward need for these params (one buffer serves
  // both; any alignment; contents need not be initialised and are garbage afterwards). CPU: a few MiB (a
  // few images im2col'ed at a time, plus the GEMMs' packing space); CUDA: the patch matrices of the whole
  // batch, twice for the backward, and the bias-gradient partial sums.
  virtual std::size_t conv2d_workspace_bytes(Conv2dParams p) const = 0;

  // y = conv(x, w) + b, cross-correlation as in Flax/XLA (and max(., 0) with p.relu).
  //   x (M, N, H, W, Cin), or (N, H, W, Cin) with shared_input
  //   w (M, KH, KW, Cin, Cout)   b (M, Cout), or nullptr for no bias
  //   y (M, N, OH, OW, Cout), written
  // workspace: conv2d_workspace_bytes(p) bytes, and then the op does not allocate; or nullptr, and the op
  // allocates it for the call (CPU) or takes the thread's growing scratch (CUDA: not during a capture).
  virtual void conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y,
                              void* workspace) const = 0;

  // Gradients of conv2d_forward given dy = dL/dy (M, N, OH, OW, Cout):
  //   dx (M, N, H, W, Cin), or (N, H, W, Cin) summed over members with shared_input; nullptr: not computed
  //   dw (M, KH, KW, Cin, Cout)   db (M, Cout), nullptr: not computed
  // x and w as given to the forward. workspace as for conv2d_forward.
  virtual void conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db, void* workspace) const = 0;

  // ---- avg_pool -----------------------------------------------------------------------------------------

  // y (M, N, OH, OW, C) = window means of x (M, N, H, W, C). Not in place.
  virtual void avg_pool_forward(AvgPoolParams p, const float* x, float* y) const = 0;

  // dx (M, N, H, W, C) from dy (M, N, OH, OW, C): each dy spread evenly over its window; inputs outside
  // every window (odd edges) get 0. dx is written whole. Not in place.
  virtual void avg_pool_backward(AvgPoolParams p, const float* dy, float* dx) const = 0;

  // The gradient through a ReLU and then avg_pool, in one pass: given r = relu(x) (M, N, H, W, C), the
  // pool's input, and dy (M, N, OH, OW, C), dx = avg_pool_backward's dx where r > 0, else 0. In place
  // allowed and intended (dx == r: the gradient replaces the activation); dx must not overlap dy.
  virtual void avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx) const = 0;

  // ---- dense --------------------------------------------------------------------------------------------

  // Bytes of scratch memory dense_forward and dense_backward need (CPU: GEMM packing space; CUDA: the
  // bias-gradient partial sums of tall batches, 0 for up to 256 rows).
  virtual std::size_t dense_workspace_bytes(DenseParams p) const = 0;

  // y = x @ w + b.  x (M, N, I), or (N, I) with shared_input;  w (M, I, O);  b (M, O) or nullptr;
  // y (M, N, O), written. Not in place. workspace: dense_workspace_bytes(p) bytes or nullptr.
  virtual void dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y,
                             void* workspace) const = 0;

  // Gradients of dense_forward given dy (M, N, O):
  //   dx (M, N, I), or (N, I) summed over members with shared_input; nullptr: not computed
  //   dw (M, I, O)   db (M, O), nullptr: not computed
  virtual void dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx,
                              float* dw, float* db, void* workspace) const = 0;

  // ---- relu ---------------------------------------------------------------------------------------------

  // y = max(x, 0) over n elements (any shape; members folded in). In place allowed (y == x). NaN stays NaN.
  virtual void relu_forward(std::size_t n, const float* x, float* y) const = 0;

  // dx = dy where y > 0, else 0, over n elements, from the forward's OUTPUT y (y > 0 exactly where x > 0;
  // the gradient at 0 is 0, as in JAX). In place allowed (dx == dy).
  virtual void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const = 0;

  // ---- softmax cross-entropy ----------------------------------------------------------------------------

  // Bytes of workspace softmax_cross_entropy needs (CPU: 0; CUDA: a loss term and a hit flag per row).
  virtual std::size_t softmax_cross_entropy_workspace_bytes(SoftmaxXentParams p) const = 0;

  // From logits (M, N, K) and labels (N) int32 in [0, K) ((M, N) without shared_labels), each output
  // optional (nullptr: not computed), all in the device's memory:
  //   loss (M): mean over the batch of -log softmax(logits)[label], computed with log-sum-exp (stable for
  //             any finite logits), accumulated in double
  //   dlogits (M, N, K): d(loss_m)/d(logits) = (softmax - onehot(label)) / N
  //   probs (M, N, K): softmax(logits)
  //   correct (M): how many rows have argmax(logits) == label (first index on ties, as jnp.argmax)
  // labels may be nullptr when only probs is asked for. A label outside [0, K): the CPU backends raise
  // ValueError; a kernel cannot raise, so the CUDA backend skips the row (its loss term 0, its dlogits row
  // zero) and adds it to *bad_labels (device i32, optional; the caller zeroes it and checks it when it
  // reads its results; with shared labels a bad label counts once). workspace: the bytes above, or null.
  virtual void softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels,
                                     float* loss, float* dlogits, float* probs, std::int32_t* correct,
                                     std::int32_t* bad_labels, void* workspace) const = 0;

  // ---- op families ----------------------------------------------------------------------------------------

  // The optimizer updates, schedules and clipping on this backend's device (kernels/optimizer_ops.h).
  virtual const OptimizerOps& optimizer() const = 0;
  // BatchNormalization, Dropout and Rescaling on this backend's device (kernels/layer_ops.h).
  virtual const LayerOps& layers() const = 0;
  // The evaluation's sums, hits, calibration and predictions on this backend's device (kernels/metric_ops.h).
  virtual const MetricOps& metrics() const = 0;

  // ---- reductions ---------------------------------------------------------------------------------------

  // out[m] = sum of x[m * n .. m * n + n), for x (M, n); accumulated in double in index order, rounded
  // once. out (M).
  virtual void reduce_sum(int members, std::size_t n, const float* x, float* out) const = 0;

  // out[m] = reduce_sum / n. out (M). n must be > 0.
  virtual void reduce_mean(int members, std::size_t n, const float* x, float* out) const = 0;

  // ---- memory -------------------------------------------------------------------------------------------

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

// The backend of a device kind: the active CPU variant (cpu_backend()), or the CUDA ops on the calling
// thread's GPU stream. The CUDA one throws NotAvailable in builds without CUDA.
const Backend& backend_for(DeviceKind kind);

// The CUDA backend run on the host: every CUDA kernel executed over its launch grid by the host launcher,
// the GEMMs by a host GEMM taking cuBLAS's column-major arguments, graphs recorded and replayed, on host
// memory (CPU devices). For checking the CUDA code where there is no GPU; much slower than the CPU ops.
const Backend& cuda_backend_on_host();

// "cuBLAS 13.1.0" (the library loaded), or "" in builds without CUDA. For logs; never throws.
std::string cublas_version();

}  // namespace pmap::kernels
