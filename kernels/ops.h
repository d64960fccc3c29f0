// Numeric ops of the MNIST CNN, forward and backward: the backend-neutral parameter structs (pmap::kernels)
// and the CPU implementation's declarations (pmap::kernels::cpu, Eigen, single-threaded, host memory).
// Every op takes a member count M: M ensemble members run as one call on member-major tensors.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pmap::kernels {

// Layout conventions (Flax's):
//   activations NHWC, member-major: (M, N, H, W, C), row-major, contiguous; member m starts at m * N*H*W*C.
//   conv weights HWIO (M, KH, KW, Cin, Cout); dense weights (M, In, Out); biases (M, Out).
//   Flatten is free: (M, N, H, W, C) seen as (M, N, H*W*C), the order of Flax's reshape.
// Pointers are float32 / int32 buffers of the stated shape. Outputs never alias inputs unless the function
// says so. Gradients are written (overwritten), never accumulated into. Bad parameters throw
// pmap::ValueError, a required pointer that is null throws pmap::ValueError naming it.

// How a convolution pads its input. same: out = ceil(in / stride), padding split as in XLA/Flax (the extra
// pixel goes after). valid: no padding, out = floor((in - k) / stride) + 1. explicit_pads: the pad_* fields.
enum class Padding { same, valid, explicit_pads };

struct Conv2dParams {
  int members = 1;       // M
  int batch = 1;         // N, per member
  int height = 0;        // H of the input
  int width = 0;         // W of the input
  int in_channels = 0;   // Cin
  int out_channels = 0;  // Cout
  int kernel_h = 3;
  int kernel_w = 3;
  int stride_h = 1;
  int stride_w = 1;
  Padding padding = Padding::same;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;  // read only with Padding::explicit_pads
  // The input is one (N, H, W, Cin) tensor read by every member (member stride 0): the first layer of an
  // ensemble that sees one batch. It is im2col'ed once for all members, and the backward's dx is the sum
  // over members, (N, H, W, Cin).
  bool shared_input = false;
  // The forward writes max(conv + b, 0): a following ReLU fused into the output. The backward ignores it:
  // its dy is the gradient with respect to the conv's own (pre-ReLU) output, already masked by the caller.
  bool relu = false;
};

// Output size and the padding before the first row / column; derived from Conv2dParams.
struct ConvGeometry {
  int out_height = 0;
  int out_width = 0;
  int pad_top = 0;
  int pad_left = 0;
};

// Average pooling with VALID padding (Flax's avg_pool default): out = floor((in - window) / stride) + 1,
// each output the mean of its window_h * window_w inputs.
struct AvgPoolParams {
  int members = 1;
  int batch = 1;
  int height = 0;
  int width = 0;
  int channels = 0;
  int window_h = 2;
  int window_w = 2;
  int stride_h = 2;
  int stride_w = 2;
};

struct PoolGeometry {
  int out_height = 0;
  int out_width = 0;
};

// y = x @ W + b per member.
struct DenseParams {
  int members = 1;
  int batch = 1;              // N, rows per member
  int in_features = 0;        // I
  int out_features = 0;       // O
  bool shared_input = false;  // x is one (N, I) matrix read by every member; dx is then summed over members
  bool relu = false;          // forward writes max(x @ W + b, 0); backward as for Conv2dParams::relu
};

// Softmax cross-entropy on integer labels, loss averaged over the batch (optax's
// softmax_cross_entropy_with_integer_labels followed by mean).
struct SoftmaxXentParams {
  int members = 1;
  int batch = 1;              // N
  int classes = 0;            // K
  bool shared_labels = true;  // labels are one (N,) vector for all members; false: (M, N)
};

// c (+)= a @ b per member, row-major: a (M, rows, depth), b (M, depth, cols), c (M, rows, cols). The GEMM
// every CPU op runs on, public for benchmarks (bench_train's sgemm rate) and tests.
struct MatmulParams {
  int members = 1;
  int rows = 0;
  int cols = 0;
  int depth = 0;
  bool accumulate = false;  // c += a @ b instead of c = a @ b
};

// SGD with momentum, optax.sgd semantics: m <- momentum * m + g; p <- p - learning_rate * m.
// nesterov (optax nesterov=True): p <- p - learning_rate * (g + momentum * m_new).
struct SgdParams {
  float learning_rate = 0.1f;
  float momentum = 0.9f;
  bool nesterov = false;
};

// Calibration statistics of predicted probabilities (calibration_sums): for each of `predictors` sets of
// `rows` probability rows over `classes` classes, sums over the rows, in row order, in double, of
//   slot 0: the negative log-likelihood -log(p[label]) (p floored at kMinProbability)
//   slot 1: the Brier score sum_c (p[c] - [c == label])^2 (0..2)
//   slot 2: the predictive entropy -sum_c p[c] log p[c] (nats; 0 log 0 = 0)
//   slot 3: hits (the argmax, first index on ties, is the label)
//   slots 4 + 3b .. 6 + 3b, for the equal-width confidence bins b = 0..14 (confidence = max_c p[c],
//   bin min(floor(15 * confidence), 14)): the rows in the bin, their confidences' sum, their hits.
// The expected calibration error (top-label, 15 bins) is sum_b |hits_b - confidence_sum_b| / rows.
inline constexpr int kCalibrationBins = 15;
inline constexpr int kCalibrationSlots = 4 + 3 * kCalibrationBins;
inline constexpr double kMinProbability = 1e-30;  // a probability that underflowed to 0 counts as this
struct CalibrationParams {
  int predictors = 1;
  int rows = 0;
  int classes = 0;
};

// Validation and derived shapes (backend-neutral). Each throws pmap::ValueError naming the bad field.
ConvGeometry conv2d_geometry(const Conv2dParams& p);
PoolGeometry avg_pool_geometry(const AvgPoolParams& p);
void validate(const DenseParams& p);
void validate(const SoftmaxXentParams& p);
void validate(const MatmulParams& p);
void validate_argmax_hits(int rows, int classes);  // rows >= 0, classes >= 1
void validate(const CalibrationParams& p);

}  // namespace pmap::kernels

// The CPU backend. Host pointers; blocking; single-threaded (each pmap CPU device calls from its own worker
// thread), and safe to call from several threads at once on distinct outputs and workspaces. Built for the
// baseline ISA and, on x86-64, again for AVX2+FMA; each call runs the variant chosen once per process
// (kernels/cpu_isa.h: the best this CPU supports, or PMAPCC_CPU_ISA=generic|avx2). Results do not
// depend on M or on the workspace: member m of a call with M members is bitwise equal to a call with that
// member alone (a shared input's dx, a sum over members, excepted: it equals the sum to rounding).
namespace pmap::kernels::cpu {

// ---- conv2d ---------------------------------------------------------------------------------------------

// Bytes of scratch memory conv2d_forward and conv2d_backward need for these params (one buffer serves both;
// any alignment; contents need not be initialised and are garbage afterwards). A few MiB: the ops im2col a
// few images at a time, plus the GEMMs' packing space (sized from this machine's cache sizes).
std::size_t conv2d_workspace_bytes(const Conv2dParams& p);

// y = conv(x, w) + b, cross-correlation as in Flax/XLA.
//   x (M, N, H, W, Cin), or (N, H, W, Cin) with shared_input
//   w (M, KH, KW, Cin, Cout)   b (M, Cout), or nullptr for no bias
//   y (M, N, OH, OW, Cout), written
// workspace: conv2d_workspace_bytes(p) bytes, and then the op does not allocate; or nullptr, and the op
// allocates it for the call. (Built against an Eigen other than 3.4, Eigen's GEMM allocates its own
// packing buffers whatever is passed.)
void conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y,
                    void* workspace);

// Gradients of conv2d_forward given dy = dL/dy (M, N, OH, OW, Cout):
//   dx (M, N, H, W, Cin), or (N, H, W, Cin) summed over members with shared_input; nullptr: not computed
//   dw (M, KH, KW, Cin, Cout)   db (M, Cout), nullptr: not computed
// x and w as given to the forward. workspace as for conv2d_forward.
void conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, void* workspace);

// ---- avg_pool -------------------------------------------------------------------------------------------

// y (M, N, OH, OW, C) = window means of x (M, N, H, W, C). Not in place.
void avg_pool_forward(AvgPoolParams p, const float* x, float* y);

// dx (M, N, H, W, C) from dy (M, N, OH, OW, C): each dy spread evenly over its window; inputs outside every
// window (odd edges) get 0. dx is written whole. Not in place.
void avg_pool_backward(AvgPoolParams p, const float* dy, float* dx);

// The gradient through a ReLU and then avg_pool, in one pass: given r = relu(x) (M, N, H, W, C), the pool's
// input, and dy (M, N, OH, OW, C), dx = avg_pool_backward's dx where r > 0, else 0. In place allowed and
// intended (dx == r: the gradient replaces the activation); dx must not overlap dy.
void avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx);

// ---- dense ----------------------------------------------------------------------------------------------

// Bytes of scratch memory dense_forward and dense_backward need (GEMM packing space; as for conv2d).
std::size_t dense_workspace_bytes(const DenseParams& p);

// y = x @ w + b.  x (M, N, I), or (N, I) with shared_input;  w (M, I, O);  b (M, O) or nullptr;
// y (M, N, O), written. Not in place. workspace: dense_workspace_bytes(p) bytes or nullptr (allocated).
void dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y, void* workspace);

// Gradients of dense_forward given dy (M, N, O):
//   dx (M, N, I), or (N, I) summed over members with shared_input; nullptr: not computed
//   dw (M, I, O)   db (M, O), nullptr: not computed
void dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, void* workspace);

// ---- relu -----------------------------------------------------------------------------------------------

// y = max(x, 0) over n elements (any shape; members folded in). In place allowed (y == x). NaN stays NaN.
void relu_forward(std::size_t n, const float* x, float* y);

// dx = dy where y > 0, else 0, over n elements, from the forward's OUTPUT y (y > 0 exactly where x > 0;
// the gradient at 0 is 0, as in JAX). In place allowed (dx == dy).
void relu_backward(std::size_t n, const float* y, const float* dy, float* dx);

// ---- softmax cross-entropy ------------------------------------------------------------------------------

// From logits (M, N, K) and labels (N) int32 in [0, K) ((M, N) without shared_labels), each output optional
// (nullptr: not computed):
//   loss (M): mean over the batch of -log softmax(logits)[label], computed with log-sum-exp (stable for any
//             finite logits), accumulated in double
//   dlogits (M, N, K): d(loss_m)/d(logits) = (softmax - onehot(label)) / N
//   probs (M, N, K): softmax(logits)
//   correct (M): how many rows have argmax(logits) == label (first index on ties, as jnp.argmax)
// labels may be nullptr when only probs is asked for. A label outside [0, K) throws pmap::ValueError.
void softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels, float* loss,
                           float* dlogits, float* probs, std::int32_t* correct);

// ---- optimizer ------------------------------------------------------------------------------------------

// One SGD-momentum step over n elements, in place on params and momentum (flat buffers, any members
// layout). grads is read only. See SgdParams for the update.
void sgd_momentum_update(SgdParams p, std::size_t n, float* params, float* momentum, const float* grads);

// ---- matmul ---------------------------------------------------------------------------------------------

// Bytes of scratch memory matmul needs (GEMM packing space; as for conv2d).
std::size_t matmul_workspace_bytes(const MatmulParams& p);

// c (M, rows, cols) = (or += with accumulate) a (M, rows, depth) @ b (M, depth, cols), member by member.
// Not in place. workspace: matmul_workspace_bytes(p) bytes, or nullptr (allocated for the call).
void matmul(MatmulParams p, const float* a, const float* b, float* c, void* workspace);

// ---- reductions -----------------------------------------------------------------------------------------

// out[m] = sum of x[m * n .. m * n + n), for x (M, n); accumulated in double, rounded once. out (M).
void reduce_sum(int members, std::size_t n, const float* x, float* out);

// out[m] = reduce_sum / n. out (M). n must be > 0.
void reduce_mean(int members, std::size_t n, const float* x, float* out);

// ---- reductions of the ensemble step (kernels/cpu_step_ops.cpp: plain loops, the same bits on every ISA) --

// out (n) = x_0 + x_1 + ... + x_{count-1} over count blocks of x (count, n), added in member order as
// floats; with accumulate, out + x_0 + ... (a later group of members). out must not overlap x.
void sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate);

// x[i] = x[i] / divisor for n elements (the ensemble mean from a sum of members' probabilities).
void divide(std::size_t n, float* x, float divisor);

// *hits += the rows r of scores (rows, classes) whose argmax (first index on ties) equals labels[r].
void argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels, std::int32_t* hits);

// For each of count members: loss_sum[m] += double(loss[m]) * rows; hits[m] += correct[m] (the running
// sums of an evaluation over pieces of a batch).
void accumulate_metrics(int count, const float* loss, const std::int32_t* correct, double rows, double* loss_sum,
                        std::int32_t* hits);

// out[m] = float(sums[m] / divisor) for count members.
void mean_from_sums(int count, const double* sums, double divisor, float* out);

// sums (predictors, kCalibrationSlots) += the calibration sums (see CalibrationParams) of probs
// (predictors, rows, classes) against labels (rows), each slot's sum over the rows taken first, in row
// order, then added. A label outside [0, classes) throws ValueError.
void calibration_sums(CalibrationParams p, const float* probs, const std::int32_t* labels, double* sums);

// Per row of probs (rows, classes): the predicted class (argmax, first index on ties), its probability and
// the predictive entropy -sum_c p log p (computed in double). Each output optional (nullptr).
void predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                 float* entropy);

}  // namespace pmap::kernels::cpu
