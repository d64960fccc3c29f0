// pmap::ops::eager: the kernels as functions of Arrays (kernels/eager/array_ops.h). Each function checks its
// operands, allocates its result on their device and calls one op of the device's backend.
#include <pmapcc/kernels/eager/array_ops.h>

#include <cstdint>
#include <limits>
#include <string>
#include <algorithm>

#include <pmap/collectives.h>
#include <pmap/error.h>

#include <pmapcc/kernels/backend.h>

#include "array_ops_checks.h"

namespace pmap::ops::eager {
using namespace detail;  // the checks of array_ops_checks.h
namespace {

thread_local const kernels::Backend* tls_override = nullptr;
thread_local kernels::Precision tls_precision = kernels::Precision::fp32;

}  // namespace

DefaultPrecision::DefaultPrecision(kernels::Precision precision) : previous_(tls_precision) {
  tls_precision = precision;
}
DefaultPrecision::~DefaultPrecision() { tls_precision = previous_; }
kernels::Precision default_precision() noexcept { return tls_precision; }

namespace detail {

void require_valid(const char* fn, const char* name, const Array& x) {
  if (!x.valid()) throw ValueError(std::string("ops::") + fn + ": " + name + " is an empty Array handle");
}

void require_dtype(const char* fn, const char* arg, const Array& x, DType want) {
  require_valid(fn, arg, x);
  if (x.dtype() != want) {
    throw ValueError(std::string("ops::") + fn + ": " + arg + " is " + x.str() + "; it must be " +
                     std::string(pmap::name(want)));
  }
}

// The backend that computes on arrays of `device`, after checking the calling thread may queue work there.
const kernels::Backend& backend_of(const char* fn, const Device& device) {
  if (device.is_cpu()) return tls_override != nullptr ? *tls_override : kernels::backend_for(DeviceKind::cpu);
  Device here;
  bool inside = true;
  try {
    here = current_device();
  } catch (const Error&) {
    inside = false;
  }
  if (!inside || here != device) {
    throw ValueError(std::string("ops::") + fn + " on " + device.str() +
                     ": a CUDA array is computed on inside the function pmap runs on its device" +
                     (inside ? " (this one runs on " + here.str() + ")" : " (this call is outside pmap)"));
  }
  return kernels::backend_for(DeviceKind::cuda);
}

Array zeros_on(const char* fn, Shape shape, DType dtype, const Device& device) {
  if (!device.is_cpu()) {  // outside the pmap of its GPU (an optimizer's init): Array's own zeroing
    bool here = false;
    try {
      here = current_device() == device;
    } catch (const Error&) {
    }
    if (!here) return Array(std::move(shape), dtype, device);
  }
  const kernels::Backend& be = backend_of(fn, device);
  Array z = Array::uninitialized(std::move(shape), dtype, device);
  be.fill_zero(z.raw_data(), z.nbytes());
  return z;
}

void require_same_device(const char* fn, const Array& a, const char* an, const Array& b, const char* bn) {
  if (a.device() != b.device()) {
    throw ValueError(std::string("ops::") + fn + ": " + an + " is " + a.str() + " and " + bn + " is " + b.str() +
                     "; operands must be on one device (copy with Array::to)");
  }
}

int as_int(const char* fn, const char* what, std::int64_t v) {
  if (v > std::numeric_limits<int>::max()) {
    throw ValueError(std::string("ops::") + fn + ": " + what + " " + std::to_string(v) + " exceeds the kernels' " +
                     std::to_string(std::numeric_limits<int>::max()));
  }
  return static_cast<int>(v);
}

// Leading axes as rows: (rows, last) of an array of ndim >= 1.
std::int64_t rows_of(const Array& x) { return x.ndim() == 0 ? 1 : x.size() / std::max<std::int64_t>(x.dim(-1), 1); }

Shape with_last(const Shape& s, std::int64_t last) {
  Shape out = s;
  out.back() = last;
  return out;
}

// Device scratch of `bytes` bytes (none for 0).
Array workspace(std::size_t bytes, const Device& device) {
  return Array::uninitialized(Shape{static_cast<std::int64_t>(bytes)}, DType::u8, device);  // scratch
}
void* ptr(Array& ws) { return ws.size() == 0 ? nullptr : ws.raw_data(); }

}  // namespace detail

namespace {

Array unary(kernels::UnaryOp op, const Array& x) {
  const char* fn = kernels::to_string(op);
  require_dtype(fn, "x", x, DType::f32);
  const kernels::Backend& be = backend_of(fn, x.device());
  Array y = Array::uninitialized(x.shape(), DType::f32, x.device());  // written whole
  be.elementwise().unary(op, static_cast<std::size_t>(x.size()), x.data<float>(), y.data<float>());
  return y;
}

Array activation_grad(kernels::UnaryOp op, const char* fn, const Array& y, const Array& dy) {
  require_dtype(fn, "y", y, DType::f32);
  require_dtype(fn, "dy", dy, DType::f32);
  require_same_device(fn, y, "y", dy, "dy");
  if (y.shape() != dy.shape()) {
    throw ShapeError(std::string("ops::") + fn + ": y " + y.signature() + " and dy " + dy.signature() +
                     " must have one shape");
  }
  const kernels::Backend& be = backend_of(fn, y.device());
  Array dx = Array::uninitialized(y.shape(), DType::f32, y.device());  // written whole
  be.elementwise().activation_backward(op, static_cast<std::size_t>(y.size()), y.data<float>(), dy.data<float>(),
                                       dx.data<float>());
  return dx;
}

// Whether b's shape is a trailing part of a's (numpy's broadcasting of b against a's trailing axes) or b is
// one element.
bool broadcasts(const Shape& a, const Shape& b) {
  if (num_elements(b) == 1) return true;
  if (b.size() > a.size()) return false;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (b[b.size() - 1 - i] != a[a.size() - 1 - i]) return false;
  }
  return true;
}

Array binary(kernels::BinaryOp op, const Array& a, const Array& b) {
  const char* fn = kernels::to_string(op);
  require_dtype(fn, "a", a, DType::f32);
  require_dtype(fn, "b", b, DType::f32);
  require_same_device(fn, a, "a", b, "b");
  if (!broadcasts(a.shape(), b.shape())) {
    throw ShapeError(std::string("ops::") + fn + ": b " + b.signature() + " does not broadcast to a " +
                     a.signature() + " (b must be a's shape, one element, or a's trailing axes)");
  }
  const kernels::Backend& be = backend_of(fn, a.device());
  Array y = Array::uninitialized(a.shape(), DType::f32, a.device());  // written whole
  be.elementwise().binary(op, static_cast<std::size_t>(a.size()), a.data<float>(),
                          static_cast<std::size_t>(b.size()), b.data<float>(), y.data<float>());
  return y;
}

Array reduce_all(const char* fn, const Array& x, bool mean) {
  require_dtype(fn, "x", x, DType::f32);
  const kernels::Backend& be = backend_of(fn, x.device());
  Array out = zeros_on(fn, Shape{}, DType::f32, x.device());
  if (x.size() == 0) {
    if (mean) throw ValueError(std::string("ops::mean: x ") + x.signature() + " has no elements");
    return out;
  }
  const auto n = static_cast<std::size_t>(x.size());
  if (mean) be.loss().reduce_mean(1, n, x.data<float>(), out.data<float>());
  else be.loss().reduce_sum(1, n, x.data<float>(), out.data<float>());
  return out;
}

Array reduce_rows(const char* fn, const Array& x, bool mean) {
  require_dtype(fn, "x", x, DType::f32);
  if (x.ndim() == 0) {
    throw ShapeError(std::string("ops::") + fn + ": x is a scalar " + x.signature() + "; it needs a leading axis");
  }
  const std::int64_t rows = x.dim(0);
  const kernels::Backend& be = backend_of(fn, x.device());
  Shape rest(x.shape().begin() + 1, x.shape().end());
  Array out = zeros_on(fn, rest, DType::f32, x.device());
  if (rows == 0) {
    if (mean) throw ValueError(std::string("ops::mean_rows: x ") + x.signature() + " has no rows");
    return out;
  }
  const auto n = static_cast<std::size_t>(out.size());
  if (n == 0) return out;
  be.metrics().sum_members(as_int(fn, "rows", rows), n, x.data<float>(), out.data<float>(), false);
  if (mean) be.metrics().divide(n, out.data<float>(), static_cast<float>(rows));
  return out;
}

}  // namespace

Array matmul(const Array& a, const Array& b, bool transpose_a, bool transpose_b) {
  const char* fn = "matmul";
  require_dtype(fn, "a", a, DType::f32);
  require_dtype(fn, "b", b, DType::f32);
  require_same_device(fn, a, "a", b, "b");
  if (transpose_a && transpose_b) {
    throw ValueError("ops::matmul: transpose_a and transpose_b together are not supported; (a^T b^T) is (b a)^T");
  }
  const auto shapes = [&] { return " (a " + a.signature() + ", b " + b.signature() + ")"; };
  if (a.ndim() < 1 || b.ndim() < 1) throw ShapeError("ops::matmul: operands need at least one axis" + shapes());
  const kernels::Backend& be = backend_of(fn, a.device());
  kernels::DenseParams p;
  p.precision = tls_precision;
  if (!transpose_a) {
    if (b.ndim() != 2) throw ShapeError("ops::matmul: b must be 2-d" + shapes());
    const std::int64_t k = a.dim(-1);
    const std::int64_t bk = transpose_b ? b.dim(1) : b.dim(0);
    if (k != bk) {
      throw ShapeError(std::string("ops::matmul: a's last axis (") + std::to_string(k) + ") is not b's " +
                       (transpose_b ? "last" : "first") + " (" + std::to_string(bk) + ")" + shapes());
    }
    const std::int64_t out_cols = transpose_b ? b.dim(0) : b.dim(1);
    Array y = Array::uninitialized(with_last(a.shape(), out_cols), DType::f32, a.device());  // written whole
    const std::int64_t rows = rows_of(a);
    if (y.size() == 0 || k == 0) {  // an empty product, or sums of nothing: zeros
      y.fill_zero();
      return y;
    }
    p.batch = as_int(fn, "rows", rows);
    Array ws;
    if (!transpose_b) {
      p.in_features = as_int(fn, "K", k);
      p.out_features = as_int(fn, "O", out_cols);
      ws = workspace(be.dense().dense_workspace_bytes(p), a.device());
      be.dense().dense_forward(p, a.data<float>(), b.data<float>(), nullptr, y.data<float>(), ptr(ws));
    } else {  // y = a @ b^T is dense_backward's dx = dy @ w^T with dy = a (rows, k) and w = b (out_cols, k)
      p.in_features = as_int(fn, "K", out_cols);
      p.out_features = as_int(fn, "O", k);
      ws = workspace(be.dense().dense_workspace_bytes(p), a.device());
      be.dense().dense_backward(p, nullptr, b.data<float>(), a.data<float>(), y.data<float>(), nullptr, nullptr,
                                ptr(ws));
    }
    return y;
  }
  // a^T @ b: a (N..., K), b (N..., O) with the same leading axes.
  if (a.ndim() < 2 || b.ndim() < 2) {
    throw ShapeError("ops::matmul: transpose_a needs 2-d or higher operands" + shapes());
  }
  if (Shape(a.shape().begin(), a.shape().end() - 1) != Shape(b.shape().begin(), b.shape().end() - 1)) {
    throw ShapeError("ops::matmul: with transpose_a, a and b must have the same leading axes" + shapes());
  }
  const std::int64_t k = a.dim(-1), o = b.dim(-1), rows = rows_of(a);
  Array y = Array::uninitialized(Shape{k, o}, DType::f32, a.device());  // written whole
  if (y.size() == 0 || rows == 0) {  // sums of nothing: zeros
    y.fill_zero();
    return y;
  }
  p.batch = as_int(fn, "rows", rows);
  p.in_features = as_int(fn, "K", k);
  p.out_features = as_int(fn, "O", o);
  Array ws = workspace(be.dense().dense_workspace_bytes(p), a.device());
  be.dense().dense_backward(p, a.data<float>(), nullptr, b.data<float>(), nullptr, y.data<float>(), nullptr, ptr(ws));
  return y;
}

Array linear(const Array& x, const Array& w, const Array& bias, bool relu) {
  const char* fn = "linear";
  require_dtype(fn, "x", x, DType::f32);
  require_dtype(fn, "w", w, DType::f32);
  require_dtype(fn, "bias", bias, DType::f32);
  require_same_device(fn, x, "x", w, "w");
  require_same_device(fn, x, "x", bias, "bias");
  const auto shapes = [&] {
    return " (x " + x.signature() + ", w " + w.signature() + ", bias " + bias.signature() + ")";
  };
  if (x.ndim() < 1 || w.ndim() != 2 || bias.ndim() != 1) {
    throw ShapeError("ops::linear: x needs an axis, w must be 2-d and bias 1-d" + shapes());
  }
  if (x.dim(-1) != w.dim(0) || bias.dim(0) != w.dim(1)) {
    throw ShapeError("ops::linear: x's last axis must be w's first and bias's length w's second" + shapes());
  }
  const kernels::Backend& be = backend_of(fn, x.device());
  Array y = Array::uninitialized(with_last(x.shape(), w.dim(1)), DType::f32, x.device());  // written whole
  if (y.size() == 0) return y;
  kernels::DenseParams p;
  p.precision = tls_precision;
  p.batch = as_int(fn, "rows", rows_of(x));
  p.in_features = as_int(fn, "I", w.dim(0));
  p.out_features = as_int(fn, "O", w.dim(1));
  p.relu = relu;
  if (p.in_features == 0) {  // no inputs: the bias alone
    y.fill_zero();
    Array b = binary(kernels::BinaryOp::add, y, bias);
    return relu ? unary(kernels::UnaryOp::relu, b) : std::move(b);
  }
  Array ws = workspace(be.dense().dense_workspace_bytes(p), x.device());
  be.dense().dense_forward(p, x.data<float>(), w.data<float>(), bias.data<float>(), y.data<float>(), ptr(ws));
  return y;
}

namespace {

// linear_members's parameters, after checking its operands: w (M, I, O), x (M, N, I) or shared (N, I), and
// the optional bias (M, O).
kernels::DenseParams members_params(const char* fn, const Array& x, const Array& w, const Array* bias) {
  require_dtype(fn, "x", x, DType::f32);
  require_dtype(fn, "w", w, DType::f32);
  require_same_device(fn, x, "x", w, "w");
  const auto shapes = [&] {
    return " (x " + x.signature() + ", w " + w.signature() + (bias ? ", bias " + bias->signature() : "") + ")";
  };
  const bool shared = x.ndim() == 2;
  if (w.ndim() != 3 || !(shared || (x.ndim() == 3 && x.dim(0) == w.dim(0))) || x.dim(-1) != w.dim(1)) {
    throw ShapeError(std::string("ops::") + fn + ": w must be (M, I, O) and x (M, N, I) or (N, I)" + shapes());
  }
  if (bias != nullptr) {
    require_dtype(fn, "bias", *bias, DType::f32);
    require_same_device(fn, x, "x", *bias, "bias");
    if (bias->shape() != Shape{w.dim(0), w.dim(2)}) throw ShapeError(std::string("ops::") + fn + ": bias must be (M, O)" + shapes());
  }
  kernels::DenseParams p;
  p.members = as_int(fn, "M", w.dim(0));
  p.batch = as_int(fn, "N", x.dim(-2));
  p.in_features = as_int(fn, "I", w.dim(1));
  p.out_features = as_int(fn, "O", w.dim(2));
  p.shared_input = shared;
  p.precision = tls_precision;
  return p;
}

}  // namespace

Array linear_members(const Array& x, const Array& w, const Array& bias, bool relu) {
  const char* fn = "linear_members";
  kernels::DenseParams p = members_params(fn, x, w, &bias);
  p.relu = relu;
  const kernels::Backend& be = backend_of(fn, x.device());
  Array y = Array::uninitialized(Shape{w.dim(0), x.dim(-2), w.dim(2)}, DType::f32, x.device());  // written whole
  if (y.size() == 0) return y;
  if (p.in_features == 0) {  // no inputs: each member's bias alone
    y.fill_zero();
    Array b = binary(kernels::BinaryOp::add, y, reshape(bias, {w.dim(0), 1, w.dim(2)}));
    return relu ? unary(kernels::UnaryOp::relu, b) : std::move(b);
  }
  Array ws = workspace(be.dense().dense_workspace_bytes(p), x.device());
  be.dense().dense_forward(p, x.data<float>(), w.data<float>(), bias.data<float>(), y.data<float>(), ptr(ws));
  return y;
}

LinearGrads linear_members_backward(const Array& x, const Array& w, const Array& dy, bool want_dx, bool want_dw,
                                    bool want_dbias) {
  const char* fn = "linear_members_backward";
  const kernels::DenseParams p = members_params(fn, x, w, nullptr);
  require_dtype(fn, "dy", dy, DType::f32);
  if (dy.shape() != Shape{w.dim(0), x.dim(-2), w.dim(2)}) {
    throw ShapeError("ops::linear_members_backward: dy " + dy.signature() + " is not the output's shape (M, N, O) = " +
                     shape_str({w.dim(0), x.dim(-2), w.dim(2)}));
  }
  const kernels::Backend& be = backend_of(fn, x.device());
  LinearGrads g;  // only what is asked for
  const bool computed = dy.size() > 0 && p.in_features > 0;  // the kernel writes each gradient whole
  const auto grad = [&](Shape shape) {
    return computed ? Array::uninitialized(std::move(shape), DType::f32, x.device())
                    : Array(std::move(shape), DType::f32, x.device());
  };
  if (want_dx) g.dx = grad(x.shape());
  if (want_dw) g.dw = grad(w.shape());
  if (want_dbias) g.dbias = grad(Shape{w.dim(0), w.dim(2)});
  if (computed) {
    Array ws = workspace(be.dense().dense_workspace_bytes(p), x.device());
    be.dense().dense_backward(p, x.data<float>(), w.data<float>(), dy.data<float>(),
                              want_dx ? g.dx.data<float>() : nullptr, want_dw ? g.dw.data<float>() : nullptr,
                              want_dbias ? g.dbias.data<float>() : nullptr, ptr(ws));
  } else if (want_dbias && dy.size() > 0) {
    g.dbias = sum_rows(transpose(dy, {1, 0, 2}));
  }
  return g;
}

Array add(const Array& a, const Array& b) { return binary(kernels::BinaryOp::add, a, b); }
Array subtract(const Array& a, const Array& b) { return binary(kernels::BinaryOp::subtract, a, b); }
Array multiply(const Array& a, const Array& b) { return binary(kernels::BinaryOp::multiply, a, b); }
Array divide(const Array& a, const Array& b) { return binary(kernels::BinaryOp::divide, a, b); }
Array maximum(const Array& a, const Array& b) { return binary(kernels::BinaryOp::maximum, a, b); }
Array minimum(const Array& a, const Array& b) { return binary(kernels::BinaryOp::minimum, a, b); }

Array scale(const Array& x, float factor, float offset) {
  require_dtype("scale", "x", x, DType::f32);
  const kernels::Backend& be = backend_of("scale", x.device());
  Array y = Array::uninitialized(x.shape(), DType::f32, x.device());  // written whole
  if (x.size() == 0) return y;
  be.layers().scale_shift(static_cast<std::size_t>(x.size()), x.data<float>(), factor, offset, y.data<float>());
  return y;
}

Array negative(const Array& x) { return unary(kernels::UnaryOp::negative, x); }
Array abs(const Array& x) { return unary(kernels::UnaryOp::abs, x); }
Array square(const Array& x) { return unary(kernels::UnaryOp::square, x); }
Array sqrt(const Array& x) { return unary(kernels::UnaryOp::sqrt, x); }
Array exp(const Array& x) { return unary(kernels::UnaryOp::exp, x); }
Array log(const Array& x) { return unary(kernels::UnaryOp::log, x); }
Array relu(const Array& x) { return unary(kernels::UnaryOp::relu, x); }
Array sigmoid(const Array& x) { return unary(kernels::UnaryOp::sigmoid, x); }
Array tanh(const Array& x) { return unary(kernels::UnaryOp::tanh, x); }

Array relu_grad(const Array& y, const Array& dy) { return activation_grad(kernels::UnaryOp::relu, "relu_grad", y, dy); }
Array sigmoid_grad(const Array& y, const Array& dy) {
  return activation_grad(kernels::UnaryOp::sigmoid, "sigmoid_grad", y, dy);
}
Array tanh_grad(const Array& y, const Array& dy) { return activation_grad(kernels::UnaryOp::tanh, "tanh_grad", y, dy); }

Array sum(const Array& x) { return reduce_all("sum", x, false); }
Array mean(const Array& x) { return reduce_all("mean", x, true); }
Array sum_rows(const Array& x) { return reduce_rows("sum_rows", x, false); }
Array mean_rows(const Array& x) { return reduce_rows("mean_rows", x, true); }

Array softmax(const Array& logits) {
  const char* fn = "softmax";
  require_dtype(fn, "logits", logits, DType::f32);
  if (logits.ndim() < 1) throw ShapeError("ops::softmax: logits " + logits.signature() + " need a class axis");
  const kernels::Backend& be = backend_of(fn, logits.device());
  Array probs = zeros_on(fn, logits.shape(), DType::f32, logits.device());
  if (probs.size() == 0) return probs;
  kernels::SoftmaxXentParams p;
  p.batch = as_int(fn, "rows", rows_of(logits));
  p.classes = as_int(fn, "classes", logits.dim(-1));
  Array ws = workspace(be.loss().softmax_cross_entropy_workspace_bytes(p), logits.device());
  be.loss().softmax_cross_entropy(p, logits.data<float>(), nullptr, nullptr, nullptr, probs.data<float>(), nullptr,
                                  nullptr, ptr(ws));
  return probs;
}

SoftmaxCrossEntropy softmax_cross_entropy(const Array& logits, const Array& labels) {
  const char* fn = "softmax_cross_entropy";
  require_dtype(fn, "logits", logits, DType::f32);
  require_dtype(fn, "labels", labels, DType::i32);
  require_same_device(fn, logits, "logits", labels, "labels");
  if (logits.ndim() != 2 || labels.ndim() != 1 || labels.dim(0) != logits.dim(0) || logits.dim(0) == 0 ||
      logits.dim(1) == 0) {
    throw ShapeError("ops::softmax_cross_entropy: logits must be (N, K) and labels (N) with N, K > 0 (logits " +
                     logits.signature() + ", labels " + labels.signature() + ")");
  }
  const kernels::Backend& be = backend_of(fn, logits.device());
  const Device& d = logits.device();
  SoftmaxCrossEntropy out{zeros_on(fn, Shape{}, DType::f32, d), zeros_on(fn, logits.shape(), DType::f32, d),
                          zeros_on(fn, Shape{}, DType::i32, d), zeros_on(fn, Shape{}, DType::i32, d)};
  kernels::SoftmaxXentParams p;
  p.batch = as_int(fn, "N", logits.dim(0));
  p.classes = as_int(fn, "K", logits.dim(1));
  Array ws = workspace(be.loss().softmax_cross_entropy_workspace_bytes(p), d);
  be.loss().softmax_cross_entropy(p, logits.data<float>(), labels.data<std::int32_t>(), out.loss.data<float>(),
                                  out.grad.data<float>(), nullptr, out.correct.data<std::int32_t>(),
                                  out.bad_labels.data<std::int32_t>(), ptr(ws));
  return out;
}

Array argmax(const Array& x) {
  require_dtype("argmax", "x", x, DType::f32);
  if (x.ndim() < 1 || x.dim(-1) == 0)
    throw ShapeError("ops::argmax: x " + x.signature() + " needs a last axis of at least one element");
  const kernels::Backend& be = backend_of("argmax", x.device());
  Array out = zeros_on(__func__, Shape(x.shape().begin(), x.shape().end() - 1), DType::i32, x.device());
  if (out.size() == 0) return out;
  be.metrics().predictions(as_int("argmax", "rows", rows_of(x)), as_int("argmax", "K", x.dim(-1)), x.data<float>(),
                           out.data<std::int32_t>(), nullptr, nullptr);
  return out;
}

Array argmax_hits(const Array& scores, const Array& labels) {
  require_dtype("argmax_hits", "scores", scores, DType::f32);
  require_dtype("argmax_hits", "labels", labels, DType::i32);
  require_same_device("argmax_hits", scores, "scores", labels, "labels");
  if (scores.ndim() < 2 || labels.ndim() != 1 || scores.dim(-2) != labels.dim(0) || scores.dim(-1) == 0)
    throw ShapeError("ops::argmax_hits: scores " + scores.signature() + " and labels " + labels.signature() +
                     " must be (..., N, K) with K >= 1 and (N)");
  const kernels::Backend& be = backend_of("argmax_hits", scores.device());
  Array out = zeros_on(__func__, Shape(scores.shape().begin(), scores.shape().end() - 2), DType::i32, scores.device());
  const std::int64_t rows = labels.dim(0), classes = scores.dim(-1);
  for (std::int64_t b = 0; b < out.size() && rows > 0; ++b) {
    be.metrics().argmax_hits(as_int("argmax_hits", "N", rows), as_int("argmax_hits", "K", classes),
                             scores.data<float>() + b * rows * classes, labels.data<std::int32_t>(),
                             out.data<std::int32_t>() + b);
  }
  return out;
}

RowPredictions predictions(const Array& probs) {
  require_dtype("predictions", "probs", probs, DType::f32);
  if (probs.ndim() < 1 || probs.dim(-1) == 0)
    throw ShapeError("ops::predictions: probs " + probs.signature() + " needs a last axis of at least one element");
  const kernels::Backend& be = backend_of("predictions", probs.device());
  const Shape rows(probs.shape().begin(), probs.shape().end() - 1);
  RowPredictions out{zeros_on(__func__, rows, DType::i32, probs.device()),
                     zeros_on(__func__, rows, DType::f32, probs.device()),
                     zeros_on(__func__, rows, DType::f32, probs.device())};
  if (out.predicted.size() == 0) return out;
  be.metrics().predictions(as_int("predictions", "rows", rows_of(probs)), as_int("predictions", "K", probs.dim(-1)),
                           probs.data<float>(), out.predicted.data<std::int32_t>(), out.probability.data<float>(),
                           out.entropy.data<float>());
  return out;
}

Array sum_members(const Array& x) {
  require_dtype("sum_members", "x", x, DType::f32);
  if (x.ndim() < 1 || x.dim(0) < 1)
    throw ShapeError("ops::sum_members: x " + x.signature() + " needs a leading member axis of at least one");
  const kernels::Backend& be = backend_of("sum_members", x.device());
  Array out = zeros_on(__func__, Shape(x.shape().begin() + 1, x.shape().end()), DType::f32, x.device());
  if (out.size() > 0)
    be.metrics().sum_members(as_int("sum_members", "M", x.dim(0)), static_cast<std::size_t>(out.size()),
                             x.data<float>(), out.data<float>(), false);
  return out;
}

Array calibration_sums(const Array& probs, const Array& labels) {
  const char* fn = "calibration_sums";
  require_dtype(fn, "probs", probs, DType::f32);
  require_dtype(fn, "labels", labels, DType::i32);
  require_same_device(fn, probs, "probs", labels, "labels");
  if (probs.ndim() != 3 || labels.ndim() != 1 || probs.dim(1) != labels.dim(0) || probs.dim(2) == 0)
    throw ShapeError("ops::calibration_sums: probs " + probs.signature() + " and labels " + labels.signature() +
                     " must be (P, N, K) with K >= 1 and (N)");
  const kernels::Backend& be = backend_of(fn, probs.device());
  Array sums = zeros_on(fn, Shape{probs.dim(0), kernels::kCalibrationSlots}, DType::f64, probs.device());
  const kernels::CalibrationParams p{as_int(fn, "P", probs.dim(0)), as_int(fn, "N", probs.dim(1)),
                                     as_int(fn, "K", probs.dim(2))};
  if (p.predictors == 0 || p.rows == 0) return sums;
  Array ws = workspace(be.metrics().calibration_workspace_bytes(p), probs.device());
  be.metrics().calibration_sums(p, probs.data<float>(), labels.data<std::int32_t>(), sums.data<double>(), ptr(ws));
  return sums;
}

Array reshape(const Array& x, const Shape& shape) {
  require_valid("reshape", "x", x);
  for (auto d : shape)
    if (d < 0) throw ShapeError("ops::reshape: negative dimension in " + shape_str(shape));
  if (num_elements(shape) != x.size())
    throw ShapeError("ops::reshape: cannot reshape " + x.signature() + " to " + shape_str(shape));
  Array y = Array::uninitialized(shape, x.dtype(), x.device());  // every byte is copied over
  if (x.nbytes() == 0) return y;
  const kernels::Backend& be = backend_of("reshape", x.device());
  be.copy(y.raw_data(), x.raw_data(), x.nbytes());
  return y;
}

Array copy(const Array& x) {
  require_valid("copy", "x", x);
  const std::uint64_t tag = pmap::detail::trace_tag(x);
  if ((tag & pmap::detail::kBatchedTag) != 0) return x.copy();  // a member's view: its alias, as Array::copy
  Array y = reshape(x, x.shape());
  pmap::detail::set_trace_tag(y, tag);  // the same value: a transformation follows it, as through Array::copy
  return y;
}

Array zeros_like(const Array& x) {
  require_valid("zeros_like", "x", x);
  return zeros_on("zeros_like", x.shape(), x.dtype(), x.device());
}

Array ones(const Shape& shape, const Device& device) {
  Array z = zeros_on("ones", shape, DType::f32, device);
  return scale(z, 0.0f, 1.0f);
}

Array sum_to(const Array& x, const Shape& shape) {
  require_dtype("sum_to", "x", x, DType::f32);
  if (!broadcasts(x.shape(), shape)) {
    throw ShapeError("ops::sum_to: " + shape_str(shape) + " is not one element or a trailing part of x " +
                     x.signature());
  }
  if (x.shape() == shape) return copy(x);
  const std::int64_t width = num_elements(shape);
  Array rows = reshape(x, Shape{width == 0 ? 0 : x.size() / width, width});
  return reshape(sum_rows(rows), shape);
}

}  // namespace pmap::ops::eager

namespace pmap::ops::detail {

using eager::tls_override;

ScopedBackend::ScopedBackend(const kernels::Backend& backend) : previous_(tls_override) {
  if (backend.kind() != DeviceKind::cpu) {
    throw ValueError("ops::detail::ScopedBackend: " + backend.name() + " does not compute on host memory");
  }
  tls_override = &backend;
}

ScopedBackend::~ScopedBackend() { tls_override = previous_; }

const kernels::Backend& backend_of(const char* fn, const Device& device) { return eager::detail::backend_of(fn, device); }

}  // namespace pmap::ops::detail
