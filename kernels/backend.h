// Backend: a device kind's numeric ops, as op families (conv, dense, layers, loss, optimizer, metrics,
// elementwise, layout) behind one aggregate, so the training layer runs the same step on CPU devices and
// CUDA devices.
// Backend itself holds only what every family shares: the device kind, memory copies, and graph capture.
// There is one dispatch, the families' virtual calls: each CPU ISA variant is a Backend of its own
// (kernels/cpu_backend.h), and so is the CUDA code (kernels/cuda/backend.h).
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

#include <pmapcc/kernels/conv_ops.h>
#include <pmapcc/kernels/dense_ops.h>
#include <pmapcc/kernels/elementwise_ops.h>
#include <pmapcc/kernels/graph.h>
#include <pmapcc/kernels/layer_ops.h>
#include <pmapcc/kernels/layout_ops.h>
#include <pmapcc/kernels/loss_ops.h>
#include <pmapcc/kernels/metric_ops.h>
#include <pmapcc/kernels/optimizer_ops.h>

namespace pmap::kernels {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda", "cuda-on-host"
  virtual DeviceKind kind() const = 0;   // the kind of device whose memory the pointers are in

  // ---- op families ----------------------------------------------------------------------------------------
  // Each family is a small interface of its own header with one CPU implementation per ISA variant (or one
  // shared by all) and one CUDA implementation; a new layer, optimizer or metric adds to a family or makes
  // a new one, never a method here.

  // Convolution and average pooling (kernels/conv_ops.h).
  virtual const ConvOps& conv() const = 0;
  // Fully connected layers (kernels/dense_ops.h).
  virtual const DenseOps& dense() const = 0;
  // Softmax cross-entropy and per-member reductions (kernels/loss_ops.h).
  virtual const LossOps& loss() const = 0;
  // The optimizer's schedules, Adam's step size, clipping and SGD's update on this backend's device
  // (kernels/optimizer_ops.h).
  virtual const OptimizerOps& optimizer() const = 0;
  // BatchNormalization, Dropout and Rescaling on this backend's device (kernels/layer_ops.h).
  virtual const LayerOps& layers() const = 0;
  // The evaluation's sums, hits, calibration and predictions on this backend's device (kernels/metric_ops.h).
  virtual const MetricOps& metrics() const = 0;
  // Element-wise arithmetic and activations (kernels/elementwise_ops.h): what kernels/eager/array_ops.h runs on.
  virtual const ElementwiseOps& elementwise() const = 0;
  // Strided copies and reductions, max pooling (kernels/layout_ops.h): transpose, broadcast_to, slice,
  // concatenate, the axis reductions and max_pool of kernels/eager/array_ops.h.
  virtual const LayoutOps& layout() const = 0;

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
