// LayoutOps' names and parameter checks (kernels/layout_ops.h), shared by the CPU variants and the CUDA ops.
#include <pmapcc/kernels/layout_ops.h>

#include <string>

#include <pmap/error.h>

namespace pmap::kernels {
namespace {

void require_positive(int value, const char* field) {
  if (value <= 0) {
    throw ValueError(std::string("max_pool: ") + field + " must be > 0 (got " + std::to_string(value) + ")");
  }
}

void check_extents(const char* op, const char* what, int ndim, const std::int64_t* dims) {
  if (ndim < 0 || ndim > kMaxLayoutAxes) {
    throw ValueError(std::string(op) + ": " + what + " has " + std::to_string(ndim) + " axes; at most " +
                     std::to_string(kMaxLayoutAxes) + " are supported");
  }
  for (int k = 0; k < ndim; ++k) {
    if (dims[k] < 0) {
      throw ValueError(std::string(op) + ": " + what + " axis " + std::to_string(k) + " is negative (" +
                       std::to_string(dims[k]) + ")");
    }
  }
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
  }
  return "?";
}

void validate(const StridedCopyParams& p) { check_extents("strided_copy", "dims", p.ndim, p.dims); }

void validate(const StridedReduceParams& p) {
  check_extents("strided_reduce", "outer_dims", p.outer_ndim, p.outer_dims);
  check_extents("strided_reduce", "inner_dims", p.inner_ndim, p.inner_dims);
  for (int k = 0; k < p.inner_ndim; ++k) {
    if (p.inner_dims[k] == 0) {
      throw ValueError("strided_reduce: inner_dims hold no elements (axis " + std::to_string(k) + " is 0)");
    }
  }
}

MaxPoolGeometry max_pool_geometry(const MaxPoolParams& p) {
  require_positive(p.batch, "batch");
  require_positive(p.height, "height");
  require_positive(p.width, "width");
  require_positive(p.channels, "channels");
  require_positive(p.window_h, "window_h");
  require_positive(p.window_w, "window_w");
  require_positive(p.stride_h, "stride_h");
  require_positive(p.stride_w, "stride_w");
  MaxPoolGeometry g;
  if (p.same) {  // Keras's and TensorFlow's "same": the extra padding pixel goes after
    g.out_height = (p.height + p.stride_h - 1) / p.stride_h;
    g.out_width = (p.width + p.stride_w - 1) / p.stride_w;
    const int pad_h = (g.out_height - 1) * p.stride_h + p.window_h - p.height;
    const int pad_w = (g.out_width - 1) * p.stride_w + p.window_w - p.width;
    g.pad_top = pad_h > 0 ? pad_h / 2 : 0;
    g.pad_left = pad_w > 0 ? pad_w / 2 : 0;
    return g;
  }
  if (p.window_h > p.height || p.window_w > p.width) {
    throw ValueError("max_pool: window " + std::to_string(p.window_h) + "x" + std::to_string(p.window_w) +
                     " is larger than the input " + std::to_string(p.height) + "x" + std::to_string(p.width) +
                     " (VALID padding)");
  }
  g.out_height = (p.height - p.window_h) / p.stride_h + 1;
  g.out_width = (p.width - p.window_w) / p.stride_w + 1;
  return g;
}

}  // namespace pmap::kernels
