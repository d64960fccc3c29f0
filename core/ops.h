// pmap::ops: the differentiable operations on Arrays a user writes programs with, inside pmap or outside
// it, on any device (JAX's jnp and jax.nn). Each is a primitive (pmapcc/core/primitive.h): evaluated at
// once through the operands' device's kernels (the rules of pmapcc/kernels/eager/array_ops.h hold: f32 operands
// on one device, results on that device, CUDA arrays only inside pmap, the same bits run after run), and
// followed by grad and value_and_grad (pmapcc/core/grad.h). Collectives (pmap::psum, pmean, all_gather,
// psum_scatter, ppermute of pmap/collectives.h) are differentiable too; their transposes are in grad.h.
//
//   auto [loss, grads] = pmap::value_and_grad([&](const Mlp& p) {
//     Array h = ops::linear(x, p.w1, p.b1, /*relu=*/true);
//     return ops::mean(ops::square(ops::subtract(ops::linear(h, p.w2, p.b2), y)));
//   })(params);
#pragma once

#include <cstdint>
#include <vector>

#include <pmap/array.h>
#include <pmap/mesh.h>

#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::ops {

// ---- linear algebra ----------------------------------------------------------------------------------------
// The products (matmul, linear, conv2d, forward and VJP) run at fp32 unless a DefaultPrecision scope on the
// calling thread says bf16 (kernels/eager/array_ops.h), as jax.default_matmul_precision does:
//   pmap::pmap([&](...) { ops::DefaultPrecision bf16(pmap::kernels::Precision::bf16); return step(...); }, mesh);
using eager::DefaultPrecision;
using eager::default_precision;
// a (..., K) @ b (K, O) -> (..., O): a's leading axes are rows (as a Dense layer applies to every row).
// transpose_b: a (..., K) @ b^T with b (O, K) -> (..., O). transpose_a: a^T @ b with a (N..., K) and
// b (N..., O) -> (K, O) (the same leading axes, taken as rows). Both transposed: ValueError.
Array matmul(const Array& a, const Array& b, bool transpose_a = false, bool transpose_b = false);
// A fully connected layer, fused: x (..., I) @ w (I, O) + bias (O) -> (..., O), then max(., 0) with relu.
Array linear(const Array& x, const Array& w, const Array& bias, bool relu = false);

// ---- element-wise ------------------------------------------------------------------------------------------
// b is a's shape, one element, or a's trailing axes (numpy's broadcasting of b against a's trailing axes);
// the result has a's shape. The gradient for b is summed over the axes it was broadcast along.
Array add(const Array& a, const Array& b);
Array subtract(const Array& a, const Array& b);
Array multiply(const Array& a, const Array& b);
Array divide(const Array& a, const Array& b);
Array maximum(const Array& a, const Array& b);  // NaN where either is NaN; on ties the gradient goes to b
Array minimum(const Array& a, const Array& b);  // on ties the gradient goes to a
Array scale(const Array& x, float factor, float offset = 0.0f);  // x * factor + offset
Array negative(const Array& x);
Array abs(const Array& x);  // gradient 0 at 0
Array square(const Array& x);
Array sqrt(const Array& x);
Array exp(const Array& x);
Array log(const Array& x);

// ---- activations -------------------------------------------------------------------------------------------
Array relu(const Array& x);  // gradient 0 at 0, as jax.nn.relu
Array sigmoid(const Array& x);
Array tanh(const Array& x);
// jax.nn.gelu's default (approximate=True): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Array gelu(const Array& x);

// ---- reductions and shapes ---------------------------------------------------------------------------------
// Of all elements: shape (), accumulated in double in index order and rounded once. mean of an empty array:
// ValueError.
Array sum(const Array& x);
Array mean(const Array& x);
// Over the leading axis: x (N, ...) -> (...), added in row order as floats.
Array sum_rows(const Array& x);
Array mean_rows(const Array& x);
// x's elements in `shape` (the same count, row-major), a new array.
Array reshape(const Array& x, const Shape& shape);
// A new array with x's values (differentiable, queued with the device's other work: inside a jitted
// function on a GPU, where Array::copy() is a blocking copy that a graph capture refuses).
inline Array copy(const Array& x) { return reshape(x, x.shape()); }
// x itself, through which no gradient flows (jax.lax.stop_gradient).
Array stop_gradient(const Array& x);

// ---- axes and layout (core/layout.cpp) ---------------------------------------------------------------------
// Axes count from the end when negative (-1: the last); one out of range or given twice raises ValueError
// naming the op and the argument; shapes that do not fit raise ShapeError (the contracts are
// pmapcc/kernels/eager/array_ops.h's). At most 8 axes. Results are new contiguous arrays, the same bits on every
// backend.
//
// Over the given axes (x's shape without them, or 1 in their place with keepdims), e.g. ops::sum(x, {0, 2}).
// sum and mean: in double in index order, rounded once; their gradients spread the cotangent (/ count).
// max: NaN when any element is; its gradient goes to the maxima, split evenly among ties (as jnp.max and
// torch.amax: two equal maxima get half each).
Array sum(const Array& x, const std::vector<int>& axes, bool keepdims = false);
Array mean(const Array& x, const std::vector<int>& axes, bool keepdims = false);
Array max(const Array& x, const std::vector<int>& axes, bool keepdims = false);
// y.shape[k] = x.shape[permutation[k]] (jnp.transpose); the gradient transposes back.
Array transpose(const Array& x, const std::vector<int>& permutation);
// x repeated to `shape` by numpy's rules (jnp.broadcast_to); the gradient sums over the repeated axes.
Array broadcast_to(const Array& x, const Shape& shape);
// x[start_0:stop_0, start_1:stop_1, ...] (step 1), 0 <= start <= stop <= dim per axis; the gradient is the
// cotangent padded with zeros to x's shape.
Array slice(const Array& x, const std::vector<std::int64_t>& start, const std::vector<std::int64_t>& stop);
// The arrays joined along `axis` (jnp.concatenate), given by pointer (Arrays are move-only):
// ops::concatenate({&a, &b}, 1). Each gradient is its slice of the cotangent.
Array concatenate(const std::vector<const Array*>& xs, int axis);
// log(softmax(x)) along the last axis, stably (x - max - log(sum(exp(x - max)))) (jax.nn.log_softmax); the
// gradient is g - softmax(x) * sum(g) per row.
Array log_softmax(const Array& x);

// ---- images (N, H, W, C), channels last -------------------------------------------------------------------
// Conv2dOptions: strides, "SAME" (same = true; Keras's and Flax's split, the extra pixel after) or "VALID"
// padding, and a fused ReLU.
using eager::Conv2dOptions;
// x (N, H, W, Cin) conv w (KH, KW, Cin, Cout) + bias (Cout; an empty Array for none) -> (N, OH, OW, Cout):
// cross-correlation as Flax's nn.Conv. Differentiable in x, w and bias.
Array conv2d(const Array& x, const Array& w, const Array& bias = Array(), Conv2dOptions options = {});
// Window means with VALID padding (flax.linen.avg_pool): x (N, H, W, C) -> (N, OH, OW, C).
Array avg_pool(const Array& x, int window_h, int window_w, int stride_h, int stride_w);
// The mean over H and W: x (N, H, W, C) -> (N, C) (Keras's GlobalAveragePooling2D).
Array global_avg_pool(const Array& x);
// Window maxima (Keras's MaxPooling2D, pool_size, strides, padding "valid" by default or "same" with
// MaxPoolOptions::same): x (N, H, W, C) -> (N, OH, OW, C). Each window's chosen element is its first NaN, else
// its first maximum in window order (rows, then columns); the gradient goes to that element alone (ties: the
// first in window order, as the forward chose), the cotangents of overlapping windows added.
using eager::MaxPoolOptions;
Array max_pool(const Array& x, MaxPoolOptions options = {});

// ---- normalization and dropout ----------------------------------------------------------------------------
struct BatchNormOptions {
  bool train = true;        // the batch's statistics (and updated moving ones), else the moving statistics
  AxisNames axis_name = {}; // training: the statistics of the batch over these devices (Flax's axis_name)
  float epsilon = 1e-3f;    // Keras's default (Flax's is 1e-5)
  float momentum = 0.99f;   // moving = moving * momentum + batch * (1 - momentum)
  bool relu = false;        // max(y, 0), fused
  // Training over axis_name: the examples of every device's batch together, when the devices' batches differ
  // in size (a batch that does not split evenly); x's first dimension counts this device's. 0: x.dim(0) times
  // the axis size (every device the same).
  std::int64_t batch_examples = 0;
};
struct BatchNormResult {
  Array y;                                // x's shape
  Array moving_mean, moving_variance;     // the updated state (C): what to keep for the next step
};
// BatchNormalization over x (..., C) (every axis but the last is a row), with gamma and beta (C) each optional
// (an empty Array: Keras's scale=False / center=False) and the moving statistics (C). Differentiable in x,
// gamma and beta; the moving statistics are state, not differentiated. With axis_name the statistics are
// every device's batch's (psum'd sums over x.dim(0) times the axis size rows, or over batch_examples when the
// devices' batches differ); the gradients are each device's share (pmean them as the step does, each device's
// loss weighted by its share of the batch when they differ: train/step.h).
BatchNormResult batch_norm(const Array& x, const Array& gamma, const Array& beta, const Array& moving_mean,
                           const Array& moving_variance, const BatchNormOptions& options = {});
// Inverted dropout with a mask drawn from (key (2) u32, step (1) i64, example_offset + row, feature, stream):
// it does not depend on the device count or on how the batch is split. Differentiable in x (the same mask).
using eager::DropoutOptions;
Array dropout(const Array& x, const Array& key, const Array& step, DropoutOptions options);
// With the rate read on the device from `rate` (one f32 value in [0, 1), not differentiated) in place of
// options.rate: a member's own rate in a hyper-parameter ensemble.
Array dropout(const Array& x, const Array& key, const Array& step, const Array& rate, DropoutOptions options);

// The index of each row's largest value along the last axis (first on ties, as jnp.argmax): x (..., K) f32
// -> (...) i32. Not differentiable (its result is an integer): no gradient flows through it.
Array argmax(const Array& x);

// ---- softmax and the loss ----------------------------------------------------------------------------------
// Along the last axis: logits (..., K) -> probabilities (..., K), each row computed stably (max subtracted).
Array softmax(const Array& logits);
// The mean over rows of -log softmax(logits)[label], shape (): logits (N, K) f32, labels (N) i32 in [0, K)
// (optax.softmax_cross_entropy_with_integer_labels, averaged). Differentiable in the logits (not the labels).
// A label out of range: ValueError on CPU devices; on CUDA devices the row counts 0 (a kernel cannot raise).
Array softmax_cross_entropy(const Array& logits, const Array& labels);

}  // namespace pmap::ops

namespace pmap {

// ---- collectives for tensor parallelism (Megatron's f and g; JAX's pvary and all_gather_invariant) -------------
// Inside pmap over `axes`, for values the same on every device along them (invariant) that the devices use in
// parts (grad.h's psum passes a result's cotangent through unchanged: the devices' loss is one value).
// pvary: x unchanged, and x's cotangent psum'd over `axes`. Put it where an invariant x starts to be used for
// each device's own part of the result: the input of a column-parallel layer, whose devices each compute a block
// of its features from the whole x (the gradient of x is the sum of the blocks').
Array pvary(const Array& x, const AxisNames& axes);
// all_gather(x, axes, axis, tiled) (pmap/collectives.h), its result used alike by every device: x's cotangent is
// this device's block of the result's. Where features split over `axes` are made whole for the rest of the
// model. (all_gather's own cotangent, psum_scatter, sums the devices' parts: a result each device uses for its
// own part.) ValueError for an axis outside x's (tiled: 0..rank-1, stacked: 0..rank).
Array all_gather_invariant(const Array& x, const AxisNames& axes, int axis = 0, bool tiled = false);

}  // namespace pmap
