// The kernels as functions of Arrays, computed at once (pmap::ops::eager): each checks its operands,
// allocates its result on their device and calls one op of the device's backend. They are what the
// differentiable primitives of pmapcc/core (pmap::ops, pmapcc/core/ops.h: the functions a user calls)
// evaluate with; use those in user code, where grad follows them. Part of pmapcc::kernels.
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

#include <cstdint>
#include <vector>

#include <pmap/array.h>

namespace pmap::kernels {
class Backend;
enum class Precision;  // kernels/ops.h: fp32, bf16
}

namespace pmap::ops::eager {

// ---- the products' precision ----------------------------------------------------------------------------------
// The arithmetic of the products the calling thread's ops compute (matmul, linear, linear_members, conv2d and
// their backward ops, so their VJPs too) while the scope lives: fp32 (the default), or bf16 mixed precision
// (each operand rounded to bf16, products summed in fp32; kernels/ops.h), as jax.default_matmul_precision
// sets it for a block of code. Thread-local, as pmap runs each device's function on its own thread: open it
// inside the per-device function (a jitted function's replays then run at it too). The differentiable ops
// (pmap::ops) keep the precision they were called at, so their VJPs run at it even when grad's backward
// pass runs after the scope has closed (a scope inside the differentiated function). Scopes nest; the
// element-wise ops, reductions and pools are fp32 whatever the scope. A backend that cannot run bf16 (a CPU
// without AVX512_BF16) raises ValueError from the first product.
class DefaultPrecision {
 public:
  explicit DefaultPrecision(kernels::Precision precision);
  ~DefaultPrecision();
  DefaultPrecision(const DefaultPrecision&) = delete;
  DefaultPrecision& operator=(const DefaultPrecision&) = delete;

 private:
  kernels::Precision previous_;
};
// The calling thread's current precision of the products.
kernels::Precision default_precision() noexcept;

// ---- linear algebra ----------------------------------------------------------------------------------------
// a (..., K) @ b (K, O) -> (..., O): a's leading axes are rows (as a Dense layer applies to every row).
// transpose_b: a (..., O) @ b^T with b (K, O) -> (..., K), the input gradient of a linear layer.
// transpose_a: a^T @ b with a (N, K) and b (N, O) -> (K, O), the weight gradient of a linear layer (a and b
// must have the same leading axes, each taken as rows). Both transposed: ValueError (transpose the result).
Array matmul(const Array& a, const Array& b, bool transpose_a = false, bool transpose_b = false);
// A fully connected layer, fused: x (..., I) @ w (I, O) + bias (O) -> (..., O), then max(., 0) with relu.
Array linear(const Array& x, const Array& w, const Array& bias, bool relu = false);
// M members' layers in one call (vmap's batching rule): w (M, I, O), bias (M, O), and x (M, N, I), or one
// (N, I) that every member reads -> (M, N, O).
Array linear_members(const Array& x, const Array& w, const Array& bias, bool relu = false);
struct LinearGrads {
  Array dx, dw, dbias;  // each empty when not asked for
};
// The gradients of linear_members (without its relu: dy (M, N, O) is the gradient of the pre-activation):
// dx of x's shape (summed over members when x is shared), dw (M, I, O), dbias (M, O).
LinearGrads linear_members_backward(const Array& x, const Array& w, const Array& dy, bool want_dx, bool want_dw,
                                    bool want_dbias);

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

// ---- images (N, H, W, C), channels last -----------------------------------------------------------------
struct Conv2dOptions {
  int stride_h = 1, stride_w = 1;
  bool same = true;  // "SAME" padding as XLA/Flax/Keras (the extra pixel after), or "VALID" (none)
  bool relu = false;  // max(conv + bias, 0), fused
};
// x (N, H, W, Cin) conv w (KH, KW, Cin, Cout) [+ bias (Cout): an empty Array for none] -> (N, OH, OW, Cout),
// cross-correlation as Flax's Conv. M members in one call (vmap's batching rule): w stacked (M, KH, KW, Cin,
// Cout), bias (M, Cout), and x (M, N, H, W, Cin), or one (N, H, W, Cin) that every member reads -> (M, N, OH,
// OW, Cout); conv2d_backward's dx then has x's shape (summed over members for a shared x).
Array conv2d(const Array& x, const Array& w, const Array& bias, Conv2dOptions options = {});
struct Conv2dGrads {
  Array dx, dw, dbias;  // each empty when not asked for
};
// The gradients of conv2d (without its relu: dy is the gradient of the pre-activation) given x, w, dy.
Conv2dGrads conv2d_backward(const Array& x, const Array& w, const Array& dy, Conv2dOptions options, bool want_dx,
                            bool want_dw, bool want_dbias);
// Window means, VALID padding (Flax's avg_pool): x (N, H, W, C) -> (N, OH, OW, C); and its gradient, dy spread
// evenly over each window (dx of x's shape, 0 outside every window).
Array avg_pool(const Array& x, int window_h, int window_w, int stride_h, int stride_w);
Array avg_pool_backward(const Array& dy, const Shape& x_shape, int window_h, int window_w, int stride_h,
                        int stride_w);
// The gradient through a ReLU and then avg_pool in one pass: r = relu(x), the pool's input; dy the pool's
// output's cotangent -> avg_pool_backward's dx where r > 0, else 0 (the same bits as the two passes).
Array avg_pool_relu_backward(const Array& r, const Array& dy, int window_h, int window_w, int stride_h,
                             int stride_w);
// The same gradient written over r, which is returned (a borrowed r: a view of the same storage): for r that
// nothing reads afterwards (grad's backward pass hands over a spent activation), no new buffer. The kernels
// read each element of r before writing it, or write it without reading (the rows past the last window).
Array avg_pool_relu_backward_over(Array r, const Array& dy, int window_h, int window_w, int stride_h,
                                  int stride_w);

// ---- BatchNormalization over x (..., C): every axis but the last is a row ---------------------------------
// sums (2, C) f64: each channel's sum of x and of x^2 over the rows, in row order.
Array batch_norm_sums(const Array& x);
// stats (2, C) f32: the mean and 1 / sqrt(variance + epsilon). From sums over `count` rows (training): the
// moving statistics (C) f32 are updated in place with momentum (Keras's convention); from the moving
// statistics (sums an empty Array: inference), which stay as they are.
Array batch_norm_statistics(const Array& sums, double count, Array& moving_mean, Array& moving_variance,
                            float epsilon, float momentum);
// (x - mean) * inv_std * gamma + beta, gamma and beta (C) optional (empty Arrays), relu fused optionally.
Array batch_norm_apply(const Array& x, const Array& stats, const Array& gamma, const Array& beta, bool relu = false);
struct BatchNormBackwardSums {
  Array sums;          // (2, C) f64: the sums of dy and of dy * x_hat over the rows
  Array dgamma, dbeta;  // (C) f32: the same sums as floats (this device's share)
};
BatchNormBackwardSums batch_norm_backward_sums(const Array& x, const Array& dy, const Array& stats);
// dx from the whole batch's backward sums over `count` rows; gamma optional.
Array batch_norm_backward(const Array& x, const Array& dy, const Array& stats, const Array& sums, double count,
                          const Array& gamma);

// Inverted dropout: x (N, F...) with each element kept (and scaled by 1 / (1 - rate)) or zeroed by the mask
// drawn from (key (2) u32, *step (1) i64, example_offset + row, feature, stream) only, so it does not
// depend on the device count or the batch's split; the same call on a cotangent gives its gradient.
struct DropoutOptions {
  float rate = 0.5f;
  std::int64_t example_offset = 0;  // the global index of row 0
  std::uint32_t stream = 0;         // which dropout layer of the model
};
Array dropout(const Array& x, const Array& key, const Array& step, DropoutOptions options);
// The same with the rate read on the device from `rate` (one f32 value on x's device, a hyper-parameter
// ensemble member's) in place of options.rate: the bits options.rate = that value gives. The value must be in
// [0, 1) (the caller checks it: the device's value is not read back).
Array dropout(const Array& x, const Array& key, const Array& step, const Array& rate, DropoutOptions options);

// The index of each row's largest value along the last axis (first on ties): x (..., K) f32 -> (...) i32.
Array argmax(const Array& x);
// How many of labels' rows each block of scores (..., N, K) f32 classifies right (argmax, first on ties, equal
// to labels (N) i32): (...) i32, on the device, one count per leading index (a member's correct examples).
Array argmax_hits(const Array& scores, const Array& labels);
// Per row of probs (..., K) f32: the predicted class (argmax, first on ties) (...) i32, its probability (...) f32
// and the predictive entropy -sum_k p log p (computed in double) (...) f32.
struct RowPredictions {
  Array predicted, probability, entropy;
};
RowPredictions predictions(const Array& probs);
// The sum over the leading (member) axis, x (M, ...) f32 -> (...), added in member order as floats (the
// ensemble's sum of its members' probabilities, as the runner's evaluation adds them).
Array sum_members(const Array& x);
// The calibration sums (kernels::CalibrationParams's slots) of each of probs (P, N, K) f32's P predictors against
// labels (N) i32: (P, kernels::kCalibrationSlots) f64, each slot's sum over the rows in row order. A label
// outside [0, K): ValueError on CPU devices, the row left out on GPUs.
Array calibration_sums(const Array& probs, const Array& labels);

// ---- axes and layout (kernels/eager/array_ops_layout.cpp, LayoutOps) ----------------------------------------------
// Axes count from the end when negative (numpy's -1: the last); an axis out of range or given twice raises
// ValueError naming the op and the axis. At most 8 axes (kernels::kMaxLayoutAxes). Every result is a new
// contiguous array; copies are exact and sums run in double in a fixed order, rounded once, so the results
// are the same bits on every backend (but log_softmax on a GPU, through CUDA's exp and log).

// Over the given axes (their elements in row-major order): x's shape without them, or with 1 in their place
// with keepdims. Axes {} reduce nothing (a copy). sum over no elements is 0; mean and max of no elements
// raise ValueError. max: NaN when any element is NaN.
Array sum(const Array& x, const std::vector<int>& axes, bool keepdims = false);
Array mean(const Array& x, const std::vector<int>& axes, bool keepdims = false);
Array max(const Array& x, const std::vector<int>& axes, bool keepdims = false);
// y.shape[k] = x.shape[permutation[k]] (numpy's transpose): the permutation has one entry per axis of x.
Array transpose(const Array& x, const std::vector<int>& permutation);
// x repeated to `shape` by numpy's rules: x's axes align with shape's trailing ones, each equal or 1 (then
// repeated); shape's extra leading axes repeat the whole. Shapes that do not broadcast: ShapeError.
Array broadcast_to(const Array& x, const Shape& shape);
// x[start_0:stop_0, ...] with step 1: one start and stop per axis, 0 <= start <= stop <= dim (ShapeError
// otherwise, naming the axis). And its transpose: dy (the slice's shape) placed at `start` in zeros of x_shape.
Array slice(const Array& x, const std::vector<std::int64_t>& start, const std::vector<std::int64_t>& stop);
Array slice_backward(const Array& dy, const Shape& x_shape, const std::vector<std::int64_t>& start);
// The arrays joined along `axis`, in order: one dtype (f32), device and rank, the same dims but along the
// axis (ShapeError naming the first that differs). At least one array (ValueError).
Array concatenate(const std::vector<const Array*>& xs, int axis);
// Along the last axis, stably: x - max - log(sum(exp(x - max))), each row's max and sum as max and sum above.
Array log_softmax(const Array& x);

// Max pooling over x (N, H, W, C) as Keras's MaxPooling2D: window, strides, and VALID (the default, as
// Keras's) or "same" padding (same = true: out = ceil(in / stride), the extra pixel after; padding is never
// chosen). Each output is its window's first NaN, else its first maximum in window order (rows, then columns).
struct MaxPoolOptions {
  int window_h = 2, window_w = 2;
  int stride_h = 2, stride_w = 2;
  bool same = false;
};
Array max_pool(const Array& x, MaxPoolOptions options = {});
// The gradient: dx of x's shape, each dy (the pool's output shape) added to the element its window chose.
Array max_pool_backward(const Array& x, const Array& dy, MaxPoolOptions options = {});

// x's elements in `shape` (the same count), copied: a new array on x's device.
Array reshape(const Array& x, const Shape& shape);
// A new array with x's values, queued with the backend's other work (Array::copy() waits for a GPU, and a
// graph capture refuses it); like Array::copy() it keeps x's trace tag (a member's view: its alias).
Array copy(const Array& x);
// Zeros of x's shape, dtype and device; ones (f32) of a shape on a device.
Array zeros_like(const Array& x);
Array ones(const Shape& shape, const Device& device);
// x's rows summed over its leading axes down to `shape`, a trailing part of x's shape or one element (the
// transpose of add's broadcasting of b against a); added in row order as floats.
Array sum_to(const Array& x, const Shape& shape);

}  // namespace pmap::ops::eager

namespace pmap::ops::detail {
// For tests: while one lives, CPU arrays on the calling thread are computed by `backend` (whose kind() must
// be cpu: a CPU variant, or kernels::cuda_backend_on_host(), which runs the CUDA kernels on the host). Scopes
// nest; not shared between threads.
// The backend that computes on arrays of `device` on the calling thread (the ScopedBackend's for CPU
// devices); a CUDA device outside the pmap that runs on it throws ValueError naming ops::<fn>.
const kernels::Backend& backend_of(const char* fn, const Device& device);

class ScopedBackend {
 public:
  explicit ScopedBackend(const kernels::Backend& backend);
  ~ScopedBackend();
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

 private:
  const kernels::Backend* previous_;
};
}  // namespace pmap::ops::detail
