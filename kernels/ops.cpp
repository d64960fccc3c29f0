// Backend-neutral part of the ops: parameter validation and derived shapes (output sizes, padding).
#include <pmapcc/kernels/ops.h>

#include <pmap/error.h>

#include <string>

namespace pmap::kernels {
namespace {

void require_positive(int value, const char* op, const char* field) {
  if (value <= 0) {
    throw ValueError(std::string(op) + ": " + field + " must be > 0 (got " + std::to_string(value) + ")");
  }
}

void require_non_negative(int value, const char* op, const char* field) {
  if (value < 0) {
    throw ValueError(std::string(op) + ": " + field + " must be >= 0 (got " + std::to_string(value) + ")");
  }
}

// Output size and leading pad of one spatial axis; throws when the window does not fit.
struct Axis {
  int out;
  int pad_before;
};

Axis conv_axis(int in, int k, int stride, Padding padding, int pad_lo, int pad_hi, const char* axis) {
  if (padding == Padding::same) {
    const int out = (in + stride - 1) / stride;
    const int total = (out - 1) * stride + k - in;
    return {out, total > 0 ? total / 2 : 0};
  }
  const int lo = padding == Padding::valid ? 0 : pad_lo;
  const int hi = padding == Padding::valid ? 0 : pad_hi;
  const int span = in + lo + hi - k;
  if (span < 0) {
    throw ValueError(std::string("conv2d: kernel ") + axis + " " + std::to_string(k) +
                     " is larger than the padded input (" + std::to_string(in + lo + hi) + ")");
  }
  return {span / stride + 1, lo};
}

}  // namespace

void require(const void* ptr, const char* op, const char* arg) {
  if (ptr == nullptr) throw ValueError(std::string(op) + ": " + arg + " is null");
}

ConvGeometry conv2d_geometry(const Conv2dParams& p) {
  const char* op = "conv2d";
  require_positive(p.members, op, "members");
  require_positive(p.batch, op, "batch");
  require_positive(p.height, op, "height");
  require_positive(p.width, op, "width");
  require_positive(p.in_channels, op, "in_channels");
  require_positive(p.out_channels, op, "out_channels");
  require_positive(p.kernel_h, op, "kernel_h");
  require_positive(p.kernel_w, op, "kernel_w");
  require_positive(p.stride_h, op, "stride_h");
  require_positive(p.stride_w, op, "stride_w");
  if (p.padding == Padding::explicit_pads) {
    require_non_negative(p.pad_top, op, "pad_top");
    require_non_negative(p.pad_bottom, op, "pad_bottom");
    require_non_negative(p.pad_left, op, "pad_left");
    require_non_negative(p.pad_right, op, "pad_right");
  }
  const Axis h = conv_axis(p.height, p.kernel_h, p.stride_h, p.padding, p.pad_top, p.pad_bottom, "height");
  const Axis w = conv_axis(p.width, p.kernel_w, p.stride_w, p.padding, p.pad_left, p.pad_right, "width");
  return {h.out, w.out, h.pad_before, w.pad_before};
}

PoolGeometry avg_pool_geometry(const AvgPoolParams& p) {
  const char* op = "avg_pool";
  require_positive(p.members, op, "members");
  require_positive(p.batch, op, "batch");
  require_positive(p.height, op, "height");
  require_positive(p.width, op, "width");
  require_positive(p.channels, op, "channels");
  require_positive(p.window_h, op, "window_h");
  require_positive(p.window_w, op, "window_w");
  require_positive(p.stride_h, op, "stride_h");
  require_positive(p.stride_w, op, "stride_w");
  if (p.window_h > p.height || p.window_w > p.width) {
    throw ValueError("avg_pool: window " + std::to_string(p.window_h) + "x" + std::to_string(p.window_w) +
                     " is larger than the input " + std::to_string(p.height) + "x" + std::to_string(p.width));
  }
  return {(p.height - p.window_h) / p.stride_h + 1, (p.width - p.window_w) / p.stride_w + 1};
}

const char* name(Precision p) noexcept { return p == Precision::bf16 ? "bf16" : "fp32"; }

Precision parse_precision(const char* text, const char* what) {
  const std::string t = text == nullptr ? "" : text;
  if (t == "fp32") return Precision::fp32;
  if (t == "bf16") return Precision::bf16;
  throw ValueError(std::string(what) + ": expected fp32 or bf16, got '" + t + "'");
}

void validate(const DenseParams& p) {
  const char* op = "dense";
  require_positive(p.members, op, "members");
  require_positive(p.batch, op, "batch");
  require_positive(p.in_features, op, "in_features");
  require_positive(p.out_features, op, "out_features");
}

void validate(const SoftmaxXentParams& p) {
  const char* op = "softmax_cross_entropy";
  require_positive(p.members, op, "members");
  require_positive(p.batch, op, "batch");
  require_positive(p.classes, op, "classes");
}

void validate(const MatmulParams& p) {
  const char* op = "matmul";
  require_positive(p.members, op, "members");
  require_positive(p.rows, op, "rows");
  require_positive(p.cols, op, "cols");
  require_positive(p.depth, op, "depth");
}

void validate(const CalibrationParams& p) {
  const char* op = "calibration_sums";
  require_positive(p.predictors, op, "predictors");
  require_non_negative(p.rows, op, "rows");
  require_positive(p.classes, op, "classes");
}

void validate_argmax_hits(int rows, int classes) {
  if (rows < 0 || classes < 1)
    throw ValueError("argmax_hits: needs rows >= 0 and classes >= 1, got " + std::to_string(rows) + " and " +
                     std::to_string(classes));
}

}  // namespace pmap::kernels
