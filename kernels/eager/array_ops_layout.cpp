// pmap::ops::eager's axis and layout ops (kernels/eager/array_ops.h): reductions over axes, transpose,
// broadcast_to, slice, concatenate, log_softmax and max pooling, each a few calls of the device's LayoutOps.
#include <pmapcc/kernels/eager/array_ops.h>

#include <cstdint>
#include <string>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/kernels/backend.h>

#include "array_ops_checks.h"

namespace pmap::ops::eager {
using namespace detail;  // the checks of array_ops_checks.h
namespace {

std::string op_name(const char* fn) { return std::string("ops::") + fn; }

template <class T> std::string list_str(const std::vector<T>& v) {
  std::string s = "(";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

// Row-major strides, in elements.
Shape strides_of(const Shape& s) {
  Shape st(s.size(), 1);
  for (std::size_t k = s.size(); k-- > 1;) st[k - 1] = st[k] * s[k];
  return st;
}

void require_rank(const char* fn, const char* arg, std::size_t ndim, const std::string& what) {
  if (ndim > static_cast<std::size_t>(kernels::kMaxLayoutAxes)) {
    throw ValueError(op_name(fn) + ": " + arg + " " + what + " has " + std::to_string(ndim) + " axes; at most " +
                     std::to_string(kernels::kMaxLayoutAxes) + " are supported");
  }
}

// One flag per axis of x: whether `axes` (negative counting from the end) names it.
std::vector<bool> axis_flags(const char* fn, const char* arg, const Array& x, const std::vector<int>& axes) {
  std::vector<bool> flags(static_cast<std::size_t>(x.ndim()), false);
  for (int axis : axes) {
    const int a = axis < 0 ? axis + x.ndim() : axis;
    if (a < 0 || a >= x.ndim()) {
      throw ValueError(op_name(fn) + ": " + arg + " " + list_str(axes) + ": axis " + std::to_string(axis) +
                       " is out of range for x " + x.signature());
    }
    if (flags[static_cast<std::size_t>(a)]) {
      throw ValueError(op_name(fn) + ": " + arg + " " + list_str(axes) + ": axis " + std::to_string(a) +
                       " is given twice (x " + x.signature() + ")");
    }
    flags[static_cast<std::size_t>(a)] = true;
  }
  return flags;
}

// A strided copy of `dims` from src to dst (dst_offset and the strides given), on x's backend.
void copy_into(const kernels::Backend& be, const Shape& dims, const Shape& src_strides, std::int64_t src_offset,
               const Shape& dst_strides, std::int64_t dst_offset, const Array& src, Array& dst) {
  if (num_elements(dims) == 0) return;
  kernels::StridedCopyParams p;
  p.ndim = static_cast<int>(dims.size());
  for (std::size_t k = 0; k < dims.size(); ++k) {
    p.dims[k] = dims[k];
    p.src_strides[k] = src_strides[k];
    p.dst_strides[k] = dst_strides[k];
  }
  p.src_offset = src_offset;
  p.dst_offset = dst_offset;
  be.layout().strided_copy(p, src.data<float>(), dst.data<float>());
}

Array reduce_axes(kernels::ReduceOp op, const Array& x, const std::vector<int>& axes, bool keepdims) {
  const char* fn = kernels::to_string(op);
  require_dtype(fn, "x", x, DType::f32);
  require_rank(fn, "x", x.shape().size(), x.signature());
  const std::vector<bool> flags = axis_flags(fn, "axes", x, axes);
  const Shape strides = strides_of(x.shape());
  kernels::StridedReduceParams p;
  Shape out;
  std::int64_t count = 1;
  for (int k = 0; k < x.ndim(); ++k) {
    const bool inner = flags[static_cast<std::size_t>(k)];
    int& n = inner ? p.inner_ndim : p.outer_ndim;
    (inner ? p.inner_dims : p.outer_dims)[n] = x.dim(k);
    (inner ? p.inner_strides : p.outer_strides)[n] = strides[static_cast<std::size_t>(k)];
    ++n;
    count *= inner ? x.dim(k) : 1;
    if (!inner || keepdims) out.push_back(inner ? 1 : x.dim(k));
  }
  const kernels::Backend& be = backend_of(fn, x.device());
  Array y = zeros_on(fn, out, DType::f32, x.device());
  if (y.size() == 0) return y;
  if (count == 0) {
    if (op == kernels::ReduceOp::sum) return y;
    throw ValueError(op_name(fn) + ": x " + x.signature() + " has no elements along axes " + list_str(axes));
  }
  be.layout().strided_reduce(op, p, x.data<float>(), y.data<float>());
  return y;
}

kernels::MaxPoolParams pool_params(const char* fn, const Shape& x, const MaxPoolOptions& o) {
  if (x.size() != 4) throw ShapeError(op_name(fn) + ": x " + shape_str(x) + " must be (N, H, W, C)");
  kernels::MaxPoolParams p;
  p.batch = as_int(fn, "N", x[0]);
  p.height = as_int(fn, "H", x[1]);
  p.width = as_int(fn, "W", x[2]);
  p.channels = as_int(fn, "C", x[3]);
  p.window_h = o.window_h;
  p.window_w = o.window_w;
  p.stride_h = o.stride_h;
  p.stride_w = o.stride_w;
  p.same = o.same;
  return p;
}

kernels::MaxPoolGeometry pool_geometry(const kernels::MaxPoolParams& p) {
  try {
    return kernels::max_pool_geometry(p);
  } catch (const ValueError& e) {  // "max_pool: window_h must be > 0 (got 0)", as the public op's error
    throw ValueError(std::string("ops::") + e.what());
  }
}

}  // namespace

Array sum(const Array& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_axes(kernels::ReduceOp::sum, x, axes, keepdims);
}
Array mean(const Array& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_axes(kernels::ReduceOp::mean, x, axes, keepdims);
}
Array max(const Array& x, const std::vector<int>& axes, bool keepdims) {
  return reduce_axes(kernels::ReduceOp::max, x, axes, keepdims);
}

Array transpose(const Array& x, const std::vector<int>& permutation) {
  const char* fn = "transpose";
  require_dtype(fn, "x", x, DType::f32);
  require_rank(fn, "x", x.shape().size(), x.signature());
  if (permutation.size() != x.shape().size()) {
    throw ValueError("ops::transpose: permutation " + list_str(permutation) + " has " +
                     std::to_string(permutation.size()) + " entries; x " + x.signature() + " has " +
                     std::to_string(x.ndim()) + " axes");
  }
  axis_flags(fn, "permutation", x, permutation);  // each axis once: a permutation
  const Shape xs = strides_of(x.shape());
  Shape out, src_strides;
  for (int a : permutation) {
    const auto k = static_cast<std::size_t>(a < 0 ? a + x.ndim() : a);
    out.push_back(x.shape()[k]);
    src_strides.push_back(xs[k]);
  }
  const kernels::Backend& be = backend_of(fn, x.device());
  Array y = Array::uninitialized(out, DType::f32, x.device());  // every element copied
  copy_into(be, out, src_strides, 0, strides_of(out), 0, x, y);
  return y;
}

Array broadcast_to(const Array& x, const Shape& shape) {
  const char* fn = "broadcast_to";
  require_dtype(fn, "x", x, DType::f32);
  require_rank(fn, "shape", shape.size(), shape_str(shape));
  const auto fail = [&](const std::string& why) {
    throw ShapeError("ops::broadcast_to: x " + x.signature() + " does not broadcast to shape " + shape_str(shape) +
                     ": " + why);
  };
  for (auto d : shape)
    if (d < 0) fail("a dimension is negative");
  if (x.shape().size() > shape.size()) fail("x has more axes than the shape");
  const std::size_t lead = shape.size() - x.shape().size();
  const Shape xs = strides_of(x.shape());
  Shape src_strides(shape.size(), 0);  // 0: repeated
  for (std::size_t j = 0; j < x.shape().size(); ++j) {
    const std::int64_t have = x.shape()[j], want = shape[lead + j];
    if (have == want) src_strides[lead + j] = xs[j];
    else if (have != 1)
      fail("x's axis " + std::to_string(j) + " is " + std::to_string(have) + " against " + std::to_string(want) +
           " (numpy's rules: equal, or 1)");
  }
  const kernels::Backend& be = backend_of(fn, x.device());
  Array y = Array::uninitialized(shape, DType::f32, x.device());  // every element copied
  copy_into(be, shape, src_strides, 0, strides_of(shape), 0, x, y);
  return y;
}

Array slice(const Array& x, const std::vector<std::int64_t>& start, const std::vector<std::int64_t>& stop) {
  const char* fn = "slice";
  require_dtype(fn, "x", x, DType::f32);
  require_rank(fn, "x", x.shape().size(), x.signature());
  if (start.size() != x.shape().size() || stop.size() != x.shape().size()) {
    throw ShapeError("ops::slice: start " + list_str(start) + " and stop " + list_str(stop) +
                     " need one entry per axis of x " + x.signature());
  }
  const Shape xs = strides_of(x.shape());
  Shape out;
  std::int64_t offset = 0;
  for (std::size_t k = 0; k < start.size(); ++k) {
    if (start[k] < 0 || start[k] > stop[k] || stop[k] > x.shape()[k]) {
      throw ShapeError("ops::slice: axis " + std::to_string(k) + ": start " + std::to_string(start[k]) + ", stop " +
                       std::to_string(stop[k]) + " is out of range for x " + x.signature() +
                       " (0 <= start <= stop <= " + std::to_string(x.shape()[k]) + ")");
    }
    out.push_back(stop[k] - start[k]);
    offset += start[k] * xs[k];
  }
  const kernels::Backend& be = backend_of(fn, x.device());
  Array y = Array::uninitialized(out, DType::f32, x.device());  // every element copied
  copy_into(be, out, xs, offset, strides_of(out), 0, x, y);
  return y;
}

Array slice_backward(const Array& dy, const Shape& x_shape, const std::vector<std::int64_t>& start) {
  const char* fn = "slice_backward";
  require_dtype(fn, "dy", dy, DType::f32);
  require_rank(fn, "x_shape", x_shape.size(), shape_str(x_shape));
  bool fits = dy.shape().size() == x_shape.size() && start.size() == x_shape.size();
  for (std::size_t k = 0; fits && k < start.size(); ++k)
    fits = start[k] >= 0 && start[k] + dy.shape()[k] <= x_shape[k];
  if (!fits) {
    throw ShapeError("ops::slice_backward: dy " + dy.signature() + " at start " + list_str(start) +
                     " does not lie inside " + shape_str(x_shape));
  }
  const Shape xs = strides_of(x_shape);
  std::int64_t offset = 0;
  for (std::size_t k = 0; k < start.size(); ++k) offset += start[k] * xs[k];
  const kernels::Backend& be = backend_of(fn, dy.device());
  Array dx = zeros_on(fn, x_shape, DType::f32, dy.device());  // zeros
  copy_into(be, dy.shape(), strides_of(dy.shape()), 0, xs, offset, dy, dx);
  return dx;
}

Array concatenate(const std::vector<const Array*>& xs, int axis) {
  const char* fn = "concatenate";
  if (xs.empty()) throw ValueError("ops::concatenate: xs is empty; it needs at least one array");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == nullptr) throw ValueError("ops::concatenate: xs[" + std::to_string(i) + "] is null");
    require_dtype(fn, ("xs[" + std::to_string(i) + "]").c_str(), *xs[i], DType::f32);
  }
  const Array& first = *xs[0];
  require_rank(fn, "xs[0]", first.shape().size(), first.signature());
  const int a = axis < 0 ? axis + first.ndim() : axis;
  if (a < 0 || a >= first.ndim()) {
    throw ValueError("ops::concatenate: axis " + std::to_string(axis) + " is out of range for xs[0] " +
                     first.signature());
  }
  Shape out = first.shape();
  for (std::size_t i = 1; i < xs.size(); ++i) {
    const Array& x = *xs[i];
    require_same_device(fn, first, "xs[0]", x, ("xs[" + std::to_string(i) + "]").c_str());
    Shape s = x.shape();
    if (s.size() == out.size()) s[static_cast<std::size_t>(a)] = out[static_cast<std::size_t>(a)];
    if (s != out) {
      throw ShapeError("ops::concatenate: xs[" + std::to_string(i) + "] " + x.signature() + " does not match xs[0] " +
                       first.signature() + " but along axis " + std::to_string(a));
    }
    out[static_cast<std::size_t>(a)] += x.dim(a);
  }
  const kernels::Backend& be = backend_of(fn, first.device());
  Array y = Array::uninitialized(out, DType::f32, first.device());  // the parts cover it
  const Shape ys = strides_of(out);
  std::int64_t along = 0;
  for (const Array* x : xs) {
    copy_into(be, x->shape(), strides_of(x->shape()), 0, ys, along * ys[static_cast<std::size_t>(a)], *x, y);
    along += x->dim(a);
  }
  return y;
}

Array log_softmax(const Array& x) {
  require_dtype("log_softmax", "x", x, DType::f32);
  if (x.ndim() < 1) throw ShapeError("ops::log_softmax: x " + x.signature() + " needs a class axis (the last)");
  if (x.size() == 0) return zeros_like(x);
  Array shifted = subtract(x, broadcast_to(max(x, {-1}, true), x.shape()));  // <= 0, the row's max at 0
  Array log_sums = log(sum(exp(shifted), {-1}, true));                     // >= 0: one term is e^0
  return subtract(shifted, broadcast_to(log_sums, x.shape()));
}

Array max_pool(const Array& x, MaxPoolOptions options) {
  require_dtype("max_pool", "x", x, DType::f32);
  const kernels::MaxPoolParams p = pool_params("max_pool", x.shape(), options);
  const kernels::MaxPoolGeometry g = pool_geometry(p);
  const kernels::Backend& be = backend_of("max_pool", x.device());
  Array y = zeros_on("max_pool", Shape{x.dim(0), g.out_height, g.out_width, x.dim(3)}, DType::f32, x.device());
  be.layout().max_pool_forward(p, x.data<float>(), y.data<float>());
  return y;
}

Array max_pool_backward(const Array& x, const Array& dy, MaxPoolOptions options) {
  const char* fn = "max_pool_backward";
  require_dtype(fn, "x", x, DType::f32);
  require_dtype(fn, "dy", dy, DType::f32);
  require_same_device(fn, x, "x", dy, "dy");
  const kernels::MaxPoolParams p = pool_params(fn, x.shape(), options);
  const kernels::MaxPoolGeometry g = pool_geometry(p);
  if (dy.shape() != Shape{x.dim(0), g.out_height, g.out_width, x.dim(3)})
    throw ShapeError("ops::max_pool_backward: dy " + dy.signature() + " is not the pool's output shape");
  const kernels::Backend& be = backend_of(fn, x.device());
  Array dx = zeros_on(fn, x.shape(), DType::f32, x.device());
  be.layout().max_pool_backward(p, x.data<float>(), dy.data<float>(), dx.data<float>());
  return dx;
}

}  // namespace pmap::ops::eager
