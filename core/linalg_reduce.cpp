// The matrix, reduction, shape and loss primitives of pmap::ops (pmapcc/core/ops.h): evaluation through
// pmap::ops::eager, VJPs written in pmap::ops.
#include <pmapcc/core/ops.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/primitive.h>
#include <pmapcc/kernels/eager/array_ops.h>

namespace pmap::ops {
namespace {

using core::Arrays;

std::vector<Array> one(Array a) {
  std::vector<Array> v;
  v.push_back(std::move(a));
  return v;
}

class MatMul final : public core::Primitive {
 public:
  MatMul(bool ta, bool tb) : ta_(ta), tb_(tb) {}
  std::string name() const override { return "matmul"; }
  core::Attributes attributes() const override {
    return {{"transpose_a", std::int64_t{ta_}}, {"transpose_b", std::int64_t{tb_}},
            {"precision", std::string(kernels::name(precision_))}};
  }
  std::vector<Array> eval(Arrays in) const override {
    eager::DefaultPrecision scope(precision_);
    return one(eager::matmul(*in[0], *in[1], ta_, tb_));
  }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    eager::DefaultPrecision scope(precision_);  // the forward's, wherever the backward pass runs
    const Array &a = *in[0], &b = *in[1], &ct = *cts[0];
    std::vector<Array> g(2);
    if (ta_) {  // y (K, O) = a^T b: da = b ct^T, db = a ct
      if (w[0]) g[0] = matmul(b, ct, false, true);
      if (w[1]) g[1] = matmul(a, ct);
    } else if (tb_) {  // y (..., O) = a b^T: da = ct b, db = ct^T a
      if (w[0]) g[0] = matmul(ct, b);
      if (w[1]) g[1] = matmul(ct, a, true);
    } else {  // y (..., O) = a b: da = ct b^T, db = a^T ct
      if (w[0]) g[0] = matmul(ct, b, false, true);
      if (w[1]) g[1] = matmul(a, ct, true);
    }
    return g;
  }
  // Stacked a's leading axes are rows too: one product for every member when b is shared (b's cotangent,
  // a^T ct over every member's rows, is the members' sum). Otherwise member by member.
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    if (shared_b(batched) && in[0]->ndim() >= 2) return eval(in);
    return Primitive::batch(in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    if (shared_b(batched) && in[0]->ndim() >= 2) return vjp(in, out, cts, wanted);
    return Primitive::batch_vjp(in, out, cts, wanted, batched, members);
  }

 private:
  bool shared_b(const std::vector<bool>& batched) const { return batched[0] && !batched[1] && !ta_; }
  bool ta_, tb_;
  kernels::Precision precision_ = eager::default_precision();  // the caller's at the call (ops::DefaultPrecision)
};

class Linear final : public core::Primitive {
 public:
  explicit Linear(bool relu, bool premasked = false, kernels::Precision precision = eager::default_precision())
      : relu_(relu), premasked_(premasked), precision_(precision) {}
  std::string name() const override { return relu_ ? "linear(relu)" : "linear"; }
  core::Attributes attributes() const override {
    return {{"relu", std::int64_t{relu_}}, {"precision", std::string(kernels::name(precision_))}};
  }
  bool output_is_relu() const override { return relu_; }
  std::shared_ptr<const Primitive> premasked() const override {
    return relu_ ? std::make_shared<Linear>(true, true, precision_) : nullptr;
  }
  std::vector<Array> eval(Arrays in) const override {
    eager::DefaultPrecision scope(precision_);
    return one(eager::linear(*in[0], *in[1], *in[2], relu_));
  }
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    eager::DefaultPrecision scope(precision_);  // the forward's, wherever the backward pass runs
    const Array &x = *in[0], &wt = *in[1], &bias = *in[2];
    Array masked;
    const Array& through = pre_activation(*out[0], *cts[0], masked);
    std::vector<Array> g(3);
    if (w[0]) g[0] = matmul(through, wt, false, true);
    if (w[1]) g[1] = x.ndim() == 1 ? matmul(reshape(x, {1, x.dim(0)}), reshape(through, {1, wt.dim(1)}), true)
                                   : matmul(x, through, true);
    if (w[2]) g[2] = eager::sum_to(through, bias.shape());
    return g;
  }
  // Shared weights: stacked x's leading axes are rows, one call. Stacked weights and bias: the kernels' member
  // count (x stacked, or one x every member reads), one call. Otherwise member by member.
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    eager::DefaultPrecision scope(precision_);
    if (batched[0] && !batched[1] && !batched[2] && in[0]->ndim() >= 2) return eval(in);
    if (!(batched[1] && batched[2]) || in[0]->ndim() < (batched[0] ? 2 : 1) || in[0]->dim(-1) == 0) {
      return Primitive::batch(in, batched, members);
    }
    const Array& x = *in[0];
    Shape y_shape = x.shape();
    y_shape.back() = in[1]->dim(2);
    if (!batched[0]) y_shape.insert(y_shape.begin(), members);
    return one(std::move(eager::linear_members(as_rows(x, batched[0]), *in[1], *in[2], relu_)).reshape(y_shape));
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    eager::DefaultPrecision scope(precision_);
    if (batched[0] && !batched[1] && !batched[2] && in[0]->ndim() >= 2) return vjp(in, out, cts, wanted);
    if (!(batched[1] && batched[2]) || in[0]->ndim() < (batched[0] ? 2 : 1) || in[0]->dim(-1) == 0) {
      return Primitive::batch_vjp(in, out, cts, wanted, batched, members);
    }
    const Array& x = *in[0];
    Array masked;
    const Array& through = pre_activation(*out[0], *cts[0], masked);
    const Shape dy_rows{members, num_elements(x.shape()) / (batched[0] ? members : 1) / x.dim(-1), in[1]->dim(2)};
    auto r = eager::linear_members_backward(as_rows(x, batched[0]), *in[1], core::view_as(through, dy_rows),
                                            wanted[0], wanted[1], wanted[2]);
    std::vector<Array> g;
    g.push_back(wanted[0] ? std::move(r.dx).reshape(x.shape()) : Array());
    g.push_back(std::move(r.dw));
    g.push_back(std::move(r.dbias));
    return g;
  }

 private:
  // x as linear_members takes it: (members, rows, I) stacked, (rows, I) shared; a view.
  static Array as_rows(const Array& x, bool stacked) {
    const std::int64_t i = x.dim(-1), lead = stacked ? x.dim(0) : 1;
    const std::int64_t rows = i == 0 ? 0 : x.size() / lead / i;
    const Shape s = stacked ? Shape{lead, rows, i} : Shape{rows, i};
    return core::view_as(x, s);
  }
  // The pre-activation's cotangent: the output's, masked by the ReLU into `masked` unless it came masked.
  const Array& pre_activation(const Array& y, const Array& ct, Array& masked) const {
    if (!relu_ || premasked_) return ct;
    masked = eager::relu_grad(y, ct);
    return masked;
  }
  bool relu_;
  bool premasked_;  // the output's cotangent comes masked (Primitive::premasked)
  kernels::Precision precision_;  // the caller's at the call (ops::DefaultPrecision)
};

// sum / mean over all elements or over the leading axis.
class Reduce final : public core::Primitive {
 public:
  Reduce(bool rows, bool mean) : rows_(rows), mean_(mean) {}
  std::string name() const override { return std::string(mean_ ? "mean" : "sum") + (rows_ ? "_rows" : ""); }
  std::vector<Array> eval(Arrays in) const override {
    const Array& x = *in[0];
    return one(rows_ ? (mean_ ? eager::mean_rows(x) : eager::sum_rows(x)) : (mean_ ? eager::mean(x) : eager::sum(x)));
  }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (!w[0]) return g;
    const Array& x = *in[0];
    Array spread = eager::add(eager::zeros_like(x), *cts[0]);  // the cotangent broadcast over what was summed
    const std::int64_t count = rows_ ? x.dim(0) : x.size();
    g[0] = mean_ ? scale(spread, 1.0f / static_cast<float>(count)) : std::move(spread);
    return g;
  }
  // Of all elements: over every axis but the members' (the same sums, in double in index order). Over
  // the leading axis: member by member (those add as floats in row order).
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    if (rows_) return Primitive::batch(in, batched, members);
    std::vector<int> axes;
    for (int a = 1; a < in[0]->ndim(); ++a) axes.push_back(a);
    return one(mean_ ? eager::mean(*in[0], axes) : eager::sum(*in[0], axes));
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    if (rows_ || !wanted[0]) return Primitive::batch_vjp(in, out, cts, wanted, batched, members);
    const Array& x = *in[0];
    Shape lifted(static_cast<std::size_t>(x.ndim()), 1);
    lifted[0] = members;
    Array spread = eager::broadcast_to(core::view_as(*cts[0], lifted), x.shape());
    std::vector<Array> g(1);
    g[0] = mean_ ? scale(spread, 1.0f / static_cast<float>(x.size() / members)) : std::move(spread);
    return g;
  }

 private:
  bool rows_, mean_;
};

class Reshape final : public core::Primitive {
 public:
  explicit Reshape(Shape shape) : shape_(std::move(shape)) {}
  std::string name() const override { return "reshape"; }
  core::Attributes attributes() const override {
    return {{"shape", std::vector<std::int64_t>(shape_.begin(), shape_.end())}};
  }
  std::vector<Array> eval(Arrays in) const override { return one(eager::reshape(*in[0], shape_)); }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (w[0]) g[0] = reshape(*cts[0], in[0]->shape());
    return g;
  }
  std::vector<Array> batch(Arrays in, const std::vector<bool>&, std::int64_t members) const override {
    Shape s = shape_;
    s.insert(s.begin(), members);
    return one(eager::reshape(*in[0], s));
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>&, std::int64_t) const override {
    return vjp(in, out, cts, w);  // back to the stacked input's shape
  }

 private:
  Shape shape_;
};

class StopGradient final : public core::Primitive {
 public:
  std::string name() const override { return "stop_gradient"; }
  std::vector<Array> eval(Arrays in) const override { return one(eager::copy(*in[0])); }
  std::vector<Array> vjp(Arrays, Arrays, Arrays, const std::vector<bool>&) const override {
    return std::vector<Array>(1);
  }
  // Row by row along the last axis (argmax), or element by element (stop_gradient): the members are rows.
  std::vector<Array> batch(Arrays in, const std::vector<bool>&, std::int64_t) const override { return eval(in); }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>&, std::int64_t) const override {
    return vjp(in, out, cts, w);
  }
};

// y = softmax(x) along the last axis; dx = y * (ct - rowsum(ct * y)).
class Softmax final : public core::Primitive {
 public:
  std::string name() const override { return "softmax"; }
  std::vector<Array> eval(Arrays in) const override { return one(eager::softmax(*in[0])); }
  std::vector<Array> vjp(Arrays, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (!w[0]) return g;
    const Array &y = *out[0], &ct = *cts[0];
    const std::int64_t k = y.dim(-1), rows = y.size() / std::max<std::int64_t>(k, 1);
    Array weighted = eager::reshape(multiply(ct, y), {rows, k});
    // Each row's sum, spread back over the row: (rows, k) @ ones (k, 1) @ ones (1, k); sums of one term
    // after the first product, so the row sums are exact as the GEMM computes them.
    Array sums = matmul(weighted, eager::ones({k, 1}, y.device()));
    Array spread = eager::reshape(matmul(sums, eager::ones({1, k}, y.device())), y.shape());
    g[0] = multiply(y, subtract(ct, spread));
    return g;
  }
  // Row by row along the last axis: the members are more rows (a member without an axis: its own error).
  std::vector<Array> batch(Arrays in, const std::vector<bool>& b, std::int64_t m) const override {
    return in[0]->ndim() < 2 ? Primitive::batch(in, b, m) : eval(in);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>& b, std::int64_t m) const override {
    return in[0]->ndim() < 2 ? Primitive::batch_vjp(in, out, cts, w, b, m) : vjp(in, out, cts, w);
  }
};

class ArgMax final : public core::Primitive {
 public:
  std::string name() const override { return "argmax"; }
  std::vector<Array> eval(Arrays in) const override { return one(eager::argmax(*in[0])); }
  std::vector<Array> vjp(Arrays, Arrays, Arrays, const std::vector<bool>&) const override {
    return std::vector<Array>(1);
  }
  // Row by row along the last axis (argmax), or element by element (stop_gradient): the members are rows.
  std::vector<Array> batch(Arrays in, const std::vector<bool>&, std::int64_t) const override { return eval(in); }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>&, std::int64_t) const override {
    return vjp(in, out, cts, w);
  }
};

// Outputs: the mean loss (), and d(loss)/d(logits) for a cotangent of 1 (kept for the VJP).
class SoftmaxCrossEntropy final : public core::Primitive {
 public:
  std::string name() const override { return "softmax_cross_entropy"; }
  std::vector<Array> eval(Arrays in) const override {
    auto r = eager::softmax_cross_entropy(*in[0], *in[1]);
    std::vector<Array> out;
    out.push_back(std::move(r.loss));
    out.push_back(std::move(r.grad));
    return out;
  }
  std::vector<Array> vjp(Arrays, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(2);
    if (w[0]) g[0] = multiply(*out[1], *cts[0]);
    return g;
  }
};

}  // namespace

Array matmul(const Array& a, const Array& b, bool transpose_a, bool transpose_b) {
  return core::apply1(std::make_shared<MatMul>(transpose_a, transpose_b), {&a, &b});
}
Array linear(const Array& x, const Array& w, const Array& bias, bool relu) {
  return core::apply1(std::make_shared<Linear>(relu), {&x, &w, &bias});
}
Array sum(const Array& x) { return core::apply1(std::make_shared<Reduce>(false, false), {&x}); }
Array mean(const Array& x) { return core::apply1(std::make_shared<Reduce>(false, true), {&x}); }
Array sum_rows(const Array& x) { return core::apply1(std::make_shared<Reduce>(true, false), {&x}); }
Array mean_rows(const Array& x) { return core::apply1(std::make_shared<Reduce>(true, true), {&x}); }
Array reshape(const Array& x, const Shape& shape) { return core::apply1(std::make_shared<Reshape>(shape), {&x}); }
Array stop_gradient(const Array& x) { return core::apply1(std::make_shared<StopGradient>(), {&x}); }
Array argmax(const Array& x) { return core::apply1(std::make_shared<ArgMax>(), {&x}); }
Array softmax(const Array& logits) { return core::apply1(std::make_shared<Softmax>(), {&logits}); }
Array softmax_cross_entropy(const Array& logits, const Array& labels) {
  return core::apply1(std::make_shared<SoftmaxCrossEntropy>(), {&logits, &labels});
}

}  // namespace pmap::ops
