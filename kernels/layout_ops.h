// LayoutOps: the op family that moves and reduces f32 elements by strides: a general n-d strided copy
// (transpose, broadcast, slice, concatenate and their gradients are each one or a few of these), a reduction
// over strided inner extents (sum, mean, max over axes), and max pooling over NHWC images with its gradient.
// One CPU implementation per ISA variant (kernels/cpu/layout.cpp) and one CUDA one (kernels/cuda/layout.cu),
// both computing every element with kernels/layout_math.h, so they give the same bits (on a GPU too: copies,
// maxima and double sums in a fixed order round the same everywhere). Pointers are in the memory of the
// backend's device and ops are ordered as kernels/backend.h says. Strides and offsets count elements.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmapcc/kernels/op_list.h>

namespace pmap::kernels {

// The most axes a strided copy or reduction iterates (pmap::ops raises ValueError beyond it).
inline constexpr int kMaxLayoutAxes = 8;

// For every index (i_0, ..., i_{ndim-1}) with i_k < dims[k], in row-major order:
//   dst[dst_offset + sum_k i_k dst_strides[k]] = src[src_offset + sum_k i_k src_strides[k]]
// A source stride of 0 repeats (broadcasts) along that axis; destination indices must be distinct (no two
// items write one element). Elements of dst the copy does not reach keep their values. ndim 0 copies one.
struct StridedCopyParams {
  int ndim = 0;
  std::int64_t dims[kMaxLayoutAxes] = {};
  std::int64_t src_strides[kMaxLayoutAxes] = {};
  std::int64_t dst_strides[kMaxLayoutAxes] = {};
  std::int64_t src_offset = 0;
  std::int64_t dst_offset = 0;
};

enum class ReduceOp : std::uint8_t {
  sum,   // added in double in the inner row-major order, rounded once
  mean,  // the same sum divided by the inner count in double, rounded once
  max,   // the largest; NaN when any is NaN (numpy's max)
};
const char* to_string(ReduceOp op);  // "sum", "mean", "max"

// y is contiguous over the outer extents (row-major): y[o] for the outer index (o_0, ...) reduces
//   x[sum_k o_k outer_strides[k] + sum_j i_j inner_strides[j]]
// over every inner index (i_0, ...) in row-major order. The inner count must be > 0 (ValueError).
struct StridedReduceParams {
  int outer_ndim = 0;
  std::int64_t outer_dims[kMaxLayoutAxes] = {};
  std::int64_t outer_strides[kMaxLayoutAxes] = {};
  int inner_ndim = 0;
  std::int64_t inner_dims[kMaxLayoutAxes] = {};
  std::int64_t inner_strides[kMaxLayoutAxes] = {};
};

// Max pooling over x (N, H, W, C), channels last, as Keras's MaxPooling2D: VALID padding (out = floor((in -
// window) / stride) + 1) or "same" (out = ceil(in / stride), the padding split with the extra pixel after,
// padded positions never chosen).
struct MaxPoolParams {
  int batch = 1;  // N
  int height = 0;
  int width = 0;
  int channels = 0;
  int window_h = 2;
  int window_w = 2;
  int stride_h = 2;
  int stride_w = 2;
  bool same = false;
};

struct MaxPoolGeometry {
  int out_height = 0;
  int out_width = 0;
  int pad_top = 0;
  int pad_left = 0;
};

// Validates p (ValueError naming the field: every size > 0, a VALID window no larger than the input) and
// derives the output size and padding. Backend-neutral (kernels/layout_ops.cpp).
MaxPoolGeometry max_pool_geometry(const MaxPoolParams& p);
// ValueError naming the op and the field when ndim is outside [0, kMaxLayoutAxes], a dim is negative, or
// (reductions) the inner count is 0.
void validate(const StridedCopyParams& p);
void validate(const StridedReduceParams& p);

class LayoutOps {
 public:
  virtual ~LayoutOps() = default;

  // The ops, each with its contract: kernels/layout_ops.def.
#define PMAPCC_OP PMAPCC_OP_VIRTUAL
#include <pmapcc/kernels/layout_ops.def>
};

}  // namespace pmap::kernels
