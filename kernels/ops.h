// The ops' parameters, backend-neutral: one struct per op family, their validation and derived shapes.
// The ops themselves, with their contracts, are kernels::Backend's (kernels/backend.h). Every op takes a
// member count M: M ensemble members run as one call on member-major tensors.
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

// The arithmetic of the conv and dense products (forward and both gradients): fp32 throughout, or bf16
// mixed precision: both operands of each product rounded to bf16 (nearest, ties to even), the products
// summed in fp32; inputs, outputs, biases and everything else stay fp32 (PyTorch's CPU autocast to
// bfloat16 does the same for these ops). The CPU runs bf16 on AVX512_BF16 (with AMX where the CPU has it:
// kernels/cpu/shared/bf16_gemm.h) in its avx512 kernels only; a backend that cannot run it throws ValueError.
enum class Precision { fp32, bf16 };

const char* name(Precision p) noexcept;  // "fp32", "bf16"
// "fp32" | "bf16"; ValueError naming `what` (a flag, a field) otherwise.
Precision parse_precision(const char* text, const char* what);

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
  Precision precision = Precision::fp32;  // of the products, forward and backward
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
  Precision precision = Precision::fp32;  // of the products, forward and backward
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
// every CPU op runs on, public for benchmarks (bench_train's sgemm rate) and tests. With transpose_a, a
// holds each member's A transposed, (depth, rows) row-major (as a conv's weight gradient reads its patches);
// with transpose_b, b holds B transposed, (cols, depth) (as its input gradient reads the weights).
struct MatmulParams {
  int members = 1;
  int rows = 0;
  int cols = 0;
  int depth = 0;
  bool accumulate = false;  // c += a @ b instead of c = a @ b
  bool transpose_a = false;
  bool transpose_b = false;
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

// Throws pmap::ValueError "<op>: <arg> is null" when ptr is null: every backend's check of its pointers.
void require(const void* ptr, const char* op, const char* arg);

// Validation and derived shapes (backend-neutral). Each throws pmap::ValueError naming the bad field.
ConvGeometry conv2d_geometry(const Conv2dParams& p);
PoolGeometry avg_pool_geometry(const AvgPoolParams& p);
void validate(const DenseParams& p);
void validate(const SoftmaxXentParams& p);
void validate(const MatmulParams& p);
void validate_argmax_hits(int rows, int classes);  // rows >= 0, classes >= 1
void validate(const CalibrationParams& p);

}  // namespace pmap::kernels
