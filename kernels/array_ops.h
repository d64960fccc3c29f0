// Computing on Arrays inside pmap: pmapcc's kernels as functions of Arrays, run on the arrays' device, so
// one pmapped function computes on CPU devices and on CUDA devices alike (JAX's jnp and jax.nn inside a
// pmapped function). Part of pmapcc::kernels (and so of pmapcc::pmapcc).
//
//   auto step = pmap::pmap([&](const Array& x, const Array& y, const Array& w) {
//     Array err = ops::subtract(ops::matmul(x, w), y);          // on this device, CPU or GPU
//     Array grad = ops::matmul(x, err, /*transpose_a=*/true);
//     return pmap::pmean(ops::scale(grad, 2.0f / x.dim(0)), "data");
//   }, mesh);
//
// Rules, for every function:
// - Operands are f32 (labels i32) on one device; the result is a new array on that device. A dtype, shape or
//   device that does not fit raises ValueError (ShapeError for shapes) naming the function and the operands.
// - CPU arrays are computed at once, on the calling thread, by the active CPU ISA variant.
// - CUDA arrays are computed inside a function pmap runs on their device: the work is queued on that device's
//   stream (pmap::cuda_stream()) in call order and the call returns at once; reading a result on the host
//   (to_vector, item) waits for it, and pmap waits for all of it before it returns. Called anywhere else, a
//   CUDA array raises ValueError. Allocating a result calls cudaMalloc: fine for a loop of a few large ops; a
//   step of many small ones is faster as the training layer's kernels with buffers planned once.
// - Results are deterministic: the same inputs give the same bits run after run on one device kind and CPU
//   variant. The element-wise ops give the same bits on CPU devices and on the CUDA code run on the host;
//   on a GPU, matmul sums in cuBLAS's order, and exp, log, tanh and sigmoid use CUDA's math library.
#pragma once

#include <pmap/array.h>

namespace pmap::kernels {
class Backend;
}

namespace pmap::ops {

// ---- linear algebra ----------------------------------------------------------------------------------------
// a (..., K) @ b (K, O) -> (..., O): a's leading axes are rows (as a Dense layer applies to every row).
// transpose_b: a (..., O) @ b^T with b (K, O) -> (..., K), the input gradient of a linear layer.
// transpose_a: a^T @ b with a (N, K) and b (N, O) -> (K, O), the weight gradient of a linear layer (a and b
// must have the same leading axes, each taken as rows). Both transposed: ValueError (transpose the result).
Array matmul(const Array& a, const Array& b, bool transpose_a = false, bool transpose_b = false);
// A fully connected layer, fused: x (..., I) @ w (I, O) + bias (O) -> (..., O), then max(., 0) with relu.
Array linear(const Array& x, const Array& w, const Array& bias, bool relu = false);

// ---- element-wise ------------------------------------------------------------------------------------------
// b is a's shape, a scalar (one element), or a's trailing axes (numpy's broadcasting against a's trailing
// axes: a bias (O) added to every row of (N, O)); the result has a's shape.
Array add(const Array& a, const Array& b);
Array subtract(const Array& a, const Array& b);
Array multiply(const Array& a, const Array& b);
Array divide(const Array& a, const Array& b);
Array maximum(const Array& a, const Array& b);  // NaN where either is NaN
Array minimum(const Array& a, const Array& b);
Array scale(const Array& x, float factor, float offset = 0.0f);  // x * factor + offset
Array negative(const Array& x);
Array abs(const Array& x);
Array square(const Array& x);
Array sqrt(const Array& x);
Array exp(const Array& x);
Array log(const Array& x);

// ---- activations and their gradients -----------------------------------------------------------------------
Array relu(const Array& x);
Array sigmoid(const Array& x);
Array tanh(const Array& x);
// The input gradient from the activation's output y = f(x) and the output gradient dy (same shape).
Array relu_grad(const Array& y, const Array& dy);     // dy where y > 0, else 0
Array sigmoid_grad(const Array& y, const Array& dy);  // dy * y * (1 - y)
Array tanh_grad(const Array& y, const Array& dy);     // dy * (1 - y^2)

// ---- reductions --------------------------------------------------------------------------------------------
// Of all elements: shape (), accumulated in double in index order and rounded once. mean of an empty array:
// ValueError.
Array sum(const Array& x);
Array mean(const Array& x);
// Over the leading axis: x (N, ...) -> (...), added in row order as floats (a bias's gradient); mean of N = 0
// rows: ValueError.
Array sum_rows(const Array& x);
Array mean_rows(const Array& x);

// ---- softmax and cross-entropy -----------------------------------------------------------------------------
// Along the last axis: logits (..., K) -> probabilities (..., K), each row's computed stably (max subtracted).
Array softmax(const Array& logits);

struct SoftmaxCrossEntropy {
  Array loss;        // f32 (): the mean over rows of -log softmax(logits)[label] (optax's, averaged)
  Array grad;        // f32 (N, K): d(loss)/d(logits) = (softmax - onehot(label)) / N
  Array correct;     // i32 (): the rows whose argmax (first on ties) is the label
  Array bad_labels;  // i32 (): labels outside [0, K): CUDA devices skip such a row (its loss term and
                     // gradient 0) and count it here; on CPU devices a bad label raises ValueError instead
};
// logits (N, K) f32 and labels (N) i32 in [0, K).
SoftmaxCrossEntropy softmax_cross_entropy(const Array& logits, const Array& labels);

namespace detail {
// For tests: while one lives, CPU arrays on the calling thread are computed by `backend` (whose kind() must
// be cpu: a CPU variant, or kernels::cuda_backend_on_host(), which runs the CUDA kernels on the host). Scopes
// nest; not shared between threads.
class ScopedBackend {
 public:
  explicit ScopedBackend(const kernels::Backend& backend);
  ~ScopedBackend();
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

 private:
  const kernels::Backend* previous_;
};
}  // namespace detail

}  // namespace pmap::ops
