// pmap::ops::eager's image, normalization and dropout ops (kernels/eager/array_ops.h): convolution, average
// pooling, BatchNormalization's steps and Dropout, each checking its operands, allocating its result on
// their device and calling the device's backend.
#include <pmapcc/kernels/eager/array_ops.h>

#include <string>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/kernels/backend.h>

#include "array_ops_checks.h"

namespace pmap::ops::eager {
using namespace detail;  // the checks of array_ops_checks.h

namespace {

kernels::Conv2dParams conv_params(const char* fn, const Array& x, const Array& w, Conv2dOptions o) {
  const auto shapes = [&] { return " (x " + x.signature() + ", w " + w.signature() + ")"; };
  const bool members = w.ndim() == 5;  // stacked weights: M members in one call
  const int wo = members ? 1 : 0;      // where w's (KH, KW, Cin, Cout) start
  const bool shared = members && x.ndim() == 4;
  const int xo = members && !shared ? 1 : 0;
  const bool fits = members ? (x.ndim() == 4 || (x.ndim() == 5 && x.dim(0) == w.dim(0))) : (x.ndim() == 4 && w.ndim() == 4);
  if (!fits || w.dim(wo + 2) != x.dim(xo + 3)) {
    throw ShapeError(std::string("ops::") + fn + ": x must be (N, H, W, Cin) and w (KH, KW, Cin, Cout), or w (M, KH, "
                     "KW, Cin, Cout) with x (M, N, H, W, Cin) or (N, H, W, Cin)" + shapes());
  }
  kernels::Conv2dParams p;
  p.members = members ? as_int(fn, "M", w.dim(0)) : 1;
  p.shared_input = shared;
  p.batch = as_int(fn, "N", x.dim(xo));
  p.height = as_int(fn, "H", x.dim(xo + 1));
  p.width = as_int(fn, "W", x.dim(xo + 2));
  p.in_channels = as_int(fn, "Cin", x.dim(xo + 3));
  p.kernel_h = as_int(fn, "KH", w.dim(wo));
  p.kernel_w = as_int(fn, "KW", w.dim(wo + 1));
  p.out_channels = as_int(fn, "Cout", w.dim(wo + 3));
  p.stride_h = o.stride_h;
  p.stride_w = o.stride_w;
  p.padding = o.same ? kernels::Padding::same : kernels::Padding::valid;
  p.relu = o.relu;
  p.precision = default_precision();
  return p;
}

// The convolution's output shape (members first when its weights are stacked) and its bias's.
Shape conv_output(const kernels::Conv2dParams& p, const kernels::ConvGeometry& g, bool members) {
  Shape y{p.batch, g.out_height, g.out_width, p.out_channels};
  if (members) y.insert(y.begin(), p.members);
  return y;
}

}  // namespace

Array conv2d(const Array& x, const Array& w, const Array& bias, Conv2dOptions options) {
  const char* fn = "conv2d";
  require_dtype(fn, "x", x, DType::f32);
  require_dtype(fn, "w", w, DType::f32);
  require_same_device(fn, x, "x", w, "w");
  kernels::Conv2dParams p = conv_params(fn, x, w, options);
  const bool members = w.ndim() == 5;
  const bool has_bias = bias.valid();
  if (has_bias) {
    require_dtype(fn, "bias", bias, DType::f32);
    require_same_device(fn, x, "x", bias, "bias");
    const Shape want = members ? Shape{w.dim(0), w.dim(-1)} : Shape{w.dim(-1)};
    if (bias.shape() != want)
      throw ShapeError("ops::conv2d: bias " + bias.signature() + " must be " + shape_str(want) +
                       (members ? " (M, Cout)" : " (Cout)"));
  }
  const kernels::ConvGeometry g = kernels::conv2d_geometry(p);
  const kernels::Backend& be = backend_of(fn, x.device());
  Array y = Array::uninitialized(conv_output(p, g, members), DType::f32, x.device());  // written whole
  if (y.size() == 0) return y;
  Array ws = workspace(be.conv().conv2d_workspace_bytes(p), x.device());
  be.conv().conv2d_forward(p, x.data<float>(), w.data<float>(), has_bias ? bias.data<float>() : nullptr,
                           y.data<float>(), ptr(ws));
  return y;
}

Conv2dGrads conv2d_backward(const Array& x, const Array& w, const Array& dy, Conv2dOptions options, bool want_dx,
                            bool want_dw, bool want_dbias) {
  const char* fn = "conv2d_backward";
  require_dtype(fn, "x", x, DType::f32);
  require_dtype(fn, "w", w, DType::f32);
  require_dtype(fn, "dy", dy, DType::f32);
  options.relu = false;
  kernels::Conv2dParams p = conv_params(fn, x, w, options);
  const kernels::ConvGeometry g = kernels::conv2d_geometry(p);
  const bool members = w.ndim() == 5;
  if (dy.shape() != conv_output(p, g, members))
    throw ShapeError("ops::conv2d_backward: dy " + dy.signature() + " is not the convolution's output shape");
  const kernels::Backend& be = backend_of(fn, x.device());
  Conv2dGrads out;  // only what is asked for: written whole by the kernel, zeros when there is nothing to sum
  const bool computed = dy.size() > 0 && x.size() > 0 && w.size() > 0;
  const auto grad = [&](Shape shape) {
    return computed ? Array::uninitialized(std::move(shape), DType::f32, x.device())
                    : Array(std::move(shape), DType::f32, x.device());
  };
  if (want_dx) out.dx = grad(x.shape());
  if (want_dw) out.dw = grad(w.shape());
  if (want_dbias) out.dbias = grad(members ? Shape{w.dim(0), w.dim(-1)} : Shape{w.dim(-1)});
  if (computed) {
    Array ws = workspace(be.conv().conv2d_workspace_bytes(p), x.device());
    be.conv().conv2d_backward(p, x.data<float>(), w.data<float>(), dy.data<float>(),
                              want_dx ? out.dx.data<float>() : nullptr, want_dw ? out.dw.data<float>() : nullptr,
                              want_dbias ? out.dbias.data<float>() : nullptr, ptr(ws));
  }
  return out;
}

namespace {

kernels::AvgPoolParams pool_params(const char* fn, const Shape& x, int wh, int ww, int sh, int sw) {
  if (x.size() != 4) throw ShapeError(std::string("ops::") + fn + ": x " + shape_str(x) + " must be (N, H, W, C)");
  kernels::AvgPoolParams p;
  p.batch = as_int(fn, "N", x[0]);
  p.height = as_int(fn, "H", x[1]);
  p.width = as_int(fn, "W", x[2]);
  p.channels = as_int(fn, "C", x[3]);
  p.window_h = wh;
  p.window_w = ww;
  p.stride_h = sh;
  p.stride_w = sw;
  return p;
}

}  // namespace

Array avg_pool(const Array& x, int window_h, int window_w, int stride_h, int stride_w) {
  require_dtype("avg_pool", "x", x, DType::f32);
  const kernels::AvgPoolParams p = pool_params("avg_pool", x.shape(), window_h, window_w, stride_h, stride_w);
  const kernels::PoolGeometry g = kernels::avg_pool_geometry(p);
  const kernels::Backend& be = backend_of("avg_pool", x.device());
  Array y = Array::uninitialized(Shape{x.dim(0), g.out_height, g.out_width, x.dim(3)}, DType::f32, x.device());
  if (y.size() > 0) be.conv().avg_pool_forward(p, x.data<float>(), y.data<float>());
  return y;
}

Array avg_pool_backward(const Array& dy, const Shape& x_shape, int window_h, int window_w, int stride_h,
                        int stride_w) {
  require_dtype("avg_pool_backward", "dy", dy, DType::f32);
  const kernels::AvgPoolParams p = pool_params("avg_pool_backward", x_shape, window_h, window_w, stride_h, stride_w);
  const kernels::PoolGeometry g = kernels::avg_pool_geometry(p);
  if (dy.shape() != Shape{x_shape[0], g.out_height, g.out_width, x_shape[3]})
    throw ShapeError("ops::avg_pool_backward: dy " + dy.signature() + " is not the pool's output shape");
  const kernels::Backend& be = backend_of("avg_pool_backward", dy.device());
  Array dx = Array::uninitialized(x_shape, DType::f32, dy.device());  // written whole
  if (dx.size() > 0) be.conv().avg_pool_backward(p, dy.data<float>(), dx.data<float>());
  return dx;
}

namespace {

// avg_pool_relu_backward's checks; the kernel's parameters.
kernels::AvgPoolParams pool_relu_params(const char* fn, const Array& r, const Array& dy, int window_h, int window_w,
                                        int stride_h, int stride_w) {
  require_dtype(fn, "r", r, DType::f32);
  require_dtype(fn, "dy", dy, DType::f32);
  require_same_device(fn, r, "r", dy, "dy");
  const kernels::AvgPoolParams p = pool_params(fn, r.shape(), window_h, window_w, stride_h, stride_w);
  const kernels::PoolGeometry g = kernels::avg_pool_geometry(p);
  if (dy.shape() != Shape{r.dim(0), g.out_height, g.out_width, r.dim(3)})
    throw ShapeError(std::string("ops::") + fn + ": dy " + dy.signature() + " is not the pool's output shape");
  return p;
}

}  // namespace

Array avg_pool_relu_backward(const Array& r, const Array& dy, int window_h, int window_w, int stride_h,
                             int stride_w) {
  const char* fn = "avg_pool_relu_backward";
  const kernels::AvgPoolParams p = pool_relu_params(fn, r, dy, window_h, window_w, stride_h, stride_w);
  const kernels::Backend& be = backend_of(fn, dy.device());
  Array dx = Array::uninitialized(r.shape(), DType::f32, dy.device());  // written whole
  if (dx.size() > 0) be.conv().avg_pool_relu_backward(p, r.data<float>(), dy.data<float>(), dx.data<float>());
  return dx;
}

Array avg_pool_relu_backward_over(Array r, const Array& dy, int window_h, int window_w, int stride_h,
                                  int stride_w) {
  const char* fn = "avg_pool_relu_backward_over";
  const kernels::AvgPoolParams p = pool_relu_params(fn, r, dy, window_h, window_w, stride_h, stride_w);
  const kernels::Backend& be = backend_of(fn, dy.device());
  if (r.size() > 0) be.conv().avg_pool_relu_backward(p, r.data<float>(), dy.data<float>(), r.data<float>());
  return r;
}

namespace {

kernels::BatchNormParams bn_params(const char* fn, const Array& x) {
  require_dtype(fn, "x", x, DType::f32);
  if (x.ndim() < 1 || x.dim(-1) == 0)
    throw ShapeError(std::string("ops::") + fn + ": x " + x.signature() + " needs a channel axis (the last)");
  kernels::BatchNormParams p;
  p.rows = rows_of(x);
  p.channels = as_int(fn, "C", x.dim(-1));
  return p;
}

void require_channels(const char* fn, const char* name, const Array& a, std::int64_t c, DType dtype) {
  require_dtype(fn, name, a, dtype);
  if (a.shape() != Shape{c}) {
    throw ShapeError(std::string("ops::") + fn + ": " + name + " " + a.signature() + " must be (" + std::to_string(c) +
                     ",), one per channel");
  }
}

void require_pair(const char* fn, const char* name, const Array& a, std::int64_t c, DType dtype) {
  require_dtype(fn, name, a, dtype);
  if (a.shape() != Shape{2, c}) {
    throw ShapeError(std::string("ops::") + fn + ": " + name + " " + a.signature() + " must be (2, " +
                     std::to_string(c) + ")");
  }
}

}  // namespace

Array batch_norm_sums(const Array& x) {
  const kernels::BatchNormParams p = bn_params("batch_norm_sums", x);
  Array sums = zeros_on(__func__, Shape{2, x.dim(-1)}, DType::f64, x.device());
  if (p.rows > 0) backend_of("batch_norm_sums", x.device()).layers().batch_norm_sums(p, x.data<float>(), sums.data<double>());
  return sums;
}

Array batch_norm_statistics(const Array& sums, double count, Array& moving_mean, Array& moving_variance,
                            float epsilon, float momentum) {
  const char* fn = "batch_norm_statistics";
  require_dtype(fn, "moving_mean", moving_mean, DType::f32);
  const std::int64_t c = moving_mean.size();
  require_channels(fn, "moving_mean", moving_mean, c, DType::f32);
  require_channels(fn, "moving_variance", moving_variance, c, DType::f32);
  if (sums.valid()) require_pair(fn, "sums", sums, c, DType::f64);
  if (sums.valid() && !(count > 0)) throw ValueError("ops::batch_norm_statistics: count must be positive");
  kernels::BatchNormParams p;
  p.channels = as_int(fn, "C", c);
  p.epsilon = epsilon;
  p.momentum = momentum;
  Array stats = zeros_on(fn, Shape{2, c}, DType::f32, moving_mean.device());
  backend_of(fn, moving_mean.device()).layers().batch_norm_statistics(
      p, sums.valid() ? sums.data<double>() : nullptr, count, moving_mean.data<float>(),
      moving_variance.data<float>(), stats.data<float>());
  return stats;
}

Array batch_norm_apply(const Array& x, const Array& stats, const Array& gamma, const Array& beta, bool relu) {
  const char* fn = "batch_norm_apply";
  kernels::BatchNormParams p = bn_params(fn, x);
  p.relu = relu;
  require_pair(fn, "stats", stats, p.channels, DType::f32);
  if (gamma.valid()) require_channels(fn, "gamma", gamma, p.channels, DType::f32);
  if (beta.valid()) require_channels(fn, "beta", beta, p.channels, DType::f32);
  Array y = Array::uninitialized(x.shape(), DType::f32, x.device());  // written whole
  if (p.rows > 0) {
    backend_of(fn, x.device()).layers().batch_norm_apply(p, x.data<float>(), stats.data<float>(),
                                                         gamma.valid() ? gamma.data<float>() : nullptr,
                                                         beta.valid() ? beta.data<float>() : nullptr, y.data<float>());
  }
  return y;
}

BatchNormBackwardSums batch_norm_backward_sums(const Array& x, const Array& dy, const Array& stats) {
  const char* fn = "batch_norm_backward_sums";
  const kernels::BatchNormParams p = bn_params(fn, x);
  require_pair(fn, "stats", stats, p.channels, DType::f32);
  require_dtype(fn, "dy", dy, DType::f32);
  if (dy.shape() != x.shape()) throw ShapeError("ops::batch_norm_backward_sums: dy " + dy.signature() + " is not x's shape");
  const std::int64_t c = p.channels;
  BatchNormBackwardSums out{zeros_on(__func__, Shape{2, c}, DType::f64, x.device()),
                            zeros_on(__func__, Shape{c}, DType::f32, x.device()),
                            zeros_on(__func__, Shape{c}, DType::f32, x.device())};
  if (p.rows > 0) {
    backend_of(fn, x.device()).layers().batch_norm_backward_sums(p, x.data<float>(), dy.data<float>(),
                                                                 stats.data<float>(), out.sums.data<double>(),
                                                                 out.dgamma.data<float>(), out.dbeta.data<float>());
  }
  return out;
}

Array batch_norm_backward(const Array& x, const Array& dy, const Array& stats, const Array& sums, double count,
                          const Array& gamma) {
  const char* fn = "batch_norm_backward";
  const kernels::BatchNormParams p = bn_params(fn, x);
  require_pair(fn, "stats", stats, p.channels, DType::f32);
  require_pair(fn, "sums", sums, p.channels, DType::f64);
  if (gamma.valid()) require_channels(fn, "gamma", gamma, p.channels, DType::f32);
  if (dy.shape() != x.shape()) throw ShapeError("ops::batch_norm_backward: dy " + dy.signature() + " is not x's shape");
  Array dx = Array::uninitialized(x.shape(), DType::f32, x.device());  // written whole
  if (p.rows > 0) {
    backend_of(fn, x.device()).layers().batch_norm_backward(p, x.data<float>(), dy.data<float>(), stats.data<float>(),
                                                            sums.data<double>(), count,
                                                            gamma.valid() ? gamma.data<float>() : nullptr,
                                                            dx.data<float>());
  }
  return dx;
}

namespace {
Array dropout_with(const Array& x, const Array& key, const Array& step, const Array* rate, DropoutOptions o) {
  const char* fn = "dropout";
  require_dtype(fn, "x", x, DType::f32);
  require_dtype(fn, "key", key, DType::u32);
  require_dtype(fn, "step", step, DType::i64);
  if (key.size() != 2 || step.size() != 1)
    throw ShapeError("ops::dropout: key " + key.signature() + " must hold 2 words and step " + step.signature() + " one");
  if (x.ndim() < 1) throw ShapeError("ops::dropout: x " + x.signature() + " needs a leading (example) axis");
  if (!(o.rate >= 0.0f && o.rate < 1.0f))
    throw ValueError("ops::dropout: rate must be in [0, 1), got " + std::to_string(o.rate));
  require_same_device(fn, x, "x", key, "key");
  require_same_device(fn, x, "x", step, "step");
  if (rate != nullptr) {
    require_dtype(fn, "rate", *rate, DType::f32);
    require_same_device(fn, x, "x", *rate, "rate");
    if (rate->size() != 1) throw ShapeError("ops::dropout: rate " + rate->signature() + " must hold one value");
  }
  Array y = zeros_on(fn, x.shape(), DType::f32, x.device());
  if (x.size() == 0) return y;
  kernels::DropoutParams p;
  p.rows = x.dim(0);
  p.features = x.size() / x.dim(0);
  p.rate = o.rate;
  p.example_offset = o.example_offset;
  p.stream = o.stream;
  if (rate != nullptr) p.rates = rate->data<float>();
  backend_of(fn, x.device()).layers().dropout(p, key.data<std::uint32_t>(), step.data<std::int64_t>(),
                                               x.data<float>(), y.data<float>());
  return y;
}
}  // namespace

Array dropout(const Array& x, const Array& key, const Array& step, DropoutOptions o) {
  return dropout_with(x, key, step, nullptr, o);
}

Array dropout(const Array& x, const Array& key, const Array& step, const Array& rate, DropoutOptions o) {
  return dropout_with(x, key, step, &rate, o);
}

}  // namespace pmap::ops::eager
