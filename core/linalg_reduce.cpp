// The matrix, reduction, shape and loss primitives of pmap::ops (pmapcc/core/ops.h): evaluation through
// pmap::ops::eager, VJPs written in pmap::ops.
#include <pmapcc/core/ops.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/core/primitive.h>
#include <pmapcc/kernels/array_ops.h>

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
  std::vector<Array> eval(Arrays in) const override { return one(eager::matmul(*in[0], *in[1], ta_, tb_)); }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
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

 private:
  bool ta_, tb_;
};

class Linear final : public core::Primitive {
 public:
  explicit Linear(bool relu) : relu_(relu) {}
  std::string name() const override { return relu_ ? "linear(relu)" : "linear"; }
  std::vector<Array> eval(Arrays in) const override { return one(eager::linear(*in[0], *in[1], *in[2], relu_)); }
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    const Array &x = *in[0], &wt = *in[1], &bias = *in[2];
    Array through = relu_ ? eager::relu_grad(*out[0], *cts[0]) : cts[0]->copy();  // d(pre-activation)
    std::vector<Array> g(3);
    if (w[0]) g[0] = matmul(through, wt, false, true);
    if (w[1]) g[1] = x.ndim() == 1 ? matmul(reshape(x, {1, x.dim(0)}), reshape(through, {1, wt.dim(1)}), true)
                                   : matmul(x, through, true);
    if (w[2]) g[2] = eager::sum_to(through, bias.shape());
    return g;
  }

 private:
  bool relu_;
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

 private:
  bool rows_, mean_;
};

class Reshape final : public core::Primitive {
 public:
  explicit Reshape(Shape shape) : shape_(std::move(shape)) {}
  std::string name() const override { return "reshape"; }
  std::vector<Array> eval(Arrays in) const override { return one(eager::reshape(*in[0], shape_)); }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (w[0]) g[0] = reshape(*cts[0], in[0]->shape());
    return g;
  }

 private:
  Shape shape_;
};

class StopGradient final : public core::Primitive {
 public:
  std::string name() const override { return "stop_gradient"; }
  std::vector<Array> eval(Arrays in) const override { return one(in[0]->copy()); }
  std::vector<Array> vjp(Arrays, Arrays, Arrays, const std::vector<bool>&) const override {
    return std::vector<Array>(1);
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
};

class ArgMax final : public core::Primitive {
 public:
  std::string name() const override { return "argmax"; }
  std::vector<Array> eval(Arrays in) const override { return one(eager::argmax(*in[0])); }
  std::vector<Array> vjp(Arrays, Arrays, Arrays, const std::vector<bool>&) const override {
    return std::vector<Array>(1);
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
