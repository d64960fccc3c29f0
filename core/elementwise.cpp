// The element-wise primitives of pmap::ops (pmapcc/core/ops.h): evaluation through pmap::ops::eager, and
// VJPs written in pmap::ops. A broadcast operand's cotangent is summed back to its shape (ops::eager::sum_to).
#include <pmapcc/core/ops.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <vector>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/primitive.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/elementwise_ops.h>

namespace pmap::ops {
namespace {

using core::Arrays;
using kernels::BinaryOp;
using kernels::UnaryOp;

class Unary final : public core::Primitive {
 public:
  explicit Unary(UnaryOp op) : op_(op) {}
  std::string name() const override { return kernels::to_string(op_); }
  std::vector<Array> eval(Arrays in) const override;
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays ct, const std::vector<bool>& wanted) const override;
  // Element-wise: the stacked members are one bigger array.
  std::vector<Array> batch(Arrays in, const std::vector<bool>&, std::int64_t) const override { return eval(in); }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>&, std::int64_t) const override {
    return vjp(in, out, cts, wanted);
  }

 private:
  UnaryOp op_;
};

std::vector<Array> Unary::eval(Arrays in) const {
  const Array& x = *in[0];
  std::vector<Array> out;
  switch (op_) {
    case UnaryOp::negative: out.push_back(eager::negative(x)); break;
    case UnaryOp::abs: out.push_back(eager::abs(x)); break;
    case UnaryOp::square: out.push_back(eager::square(x)); break;
    case UnaryOp::sqrt: out.push_back(eager::sqrt(x)); break;
    case UnaryOp::exp: out.push_back(eager::exp(x)); break;
    case UnaryOp::log: out.push_back(eager::log(x)); break;
    case UnaryOp::relu: out.push_back(eager::relu(x)); break;
    case UnaryOp::sigmoid: out.push_back(eager::sigmoid(x)); break;
    case UnaryOp::tanh: out.push_back(eager::tanh(x)); break;
  }
  return out;
}

std::vector<Array> Unary::vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted) const {
  std::vector<Array> g(1);
  if (!wanted[0]) return g;
  const Array &x = *in[0], &y = *out[0], &ct = *cts[0];
  switch (op_) {
    case UnaryOp::negative: g[0] = negative(ct); break;
    case UnaryOp::abs:  // |x| = relu(x) + relu(-x)
      g[0] = subtract(eager::relu_grad(relu(x), ct), eager::relu_grad(relu(negative(x)), ct));
      break;
    case UnaryOp::square: g[0] = multiply(ct, scale(x, 2.0f)); break;
    case UnaryOp::sqrt: g[0] = divide(scale(ct, 0.5f), y); break;
    case UnaryOp::exp: g[0] = multiply(ct, y); break;
    case UnaryOp::log: g[0] = divide(ct, x); break;
    case UnaryOp::relu: g[0] = eager::relu_grad(y, ct); break;
    case UnaryOp::sigmoid: g[0] = eager::sigmoid_grad(y, ct); break;
    case UnaryOp::tanh: g[0] = eager::tanh_grad(y, ct); break;
  }
  return g;
}

class Binary final : public core::Primitive {
 public:
  explicit Binary(BinaryOp op) : op_(op) {}
  std::string name() const override { return kernels::to_string(op_); }
  std::vector<Array> eval(Arrays in) const override;
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays ct, const std::vector<bool>& wanted) const override;
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override;
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>& batched, std::int64_t members) const override;

 private:
  BinaryOp op_;
};

std::vector<Array> Binary::eval(Arrays in) const {
  const Array &a = *in[0], &b = *in[1];
  std::vector<Array> out;
  switch (op_) {
    case BinaryOp::add: out.push_back(eager::add(a, b)); break;
    case BinaryOp::subtract: out.push_back(eager::subtract(a, b)); break;
    case BinaryOp::multiply: out.push_back(eager::multiply(a, b)); break;
    case BinaryOp::divide: out.push_back(eager::divide(a, b)); break;
    case BinaryOp::maximum: out.push_back(eager::maximum(a, b)); break;
    case BinaryOp::minimum: out.push_back(eager::minimum(a, b)); break;
  }
  return out;
}

std::vector<Array> Binary::vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted) const {
  const Array &a = *in[0], &b = *in[1], &y = *out[0], &ct = *cts[0];
  std::vector<Array> g(2);
  Array ga, gb;  // gb in a's shape, before it is summed to b's
  switch (op_) {
    case BinaryOp::add:
      ga = eager::copy(ct);
      if (wanted[1]) gb = eager::copy(ct);
      break;
    case BinaryOp::subtract:
      ga = eager::copy(ct);
      if (wanted[1]) gb = negative(ct);
      break;
    case BinaryOp::multiply:
      if (wanted[0]) ga = multiply(ct, b);
      if (wanted[1]) gb = multiply(ct, a);
      break;
    case BinaryOp::divide:  // d(a/b)/db = -a/b^2 = -y/b
      if (wanted[0]) ga = divide(ct, b);
      if (wanted[1]) gb = negative(divide(multiply(ct, y), b));
      break;
    case BinaryOp::maximum: {  // max(a, b) = b + relu(a - b): a's share where a > b
      ga = eager::relu_grad(relu(subtract(a, b)), ct);
      if (wanted[1]) gb = subtract(ct, ga);
      break;
    }
    case BinaryOp::minimum: {  // min(a, b) = a - relu(a - b): b's share where a > b
      Array to_b = eager::relu_grad(relu(subtract(a, b)), ct);
      ga = subtract(ct, to_b);
      if (wanted[1]) gb = std::move(to_b);
      break;
    }
  }
  if (wanted[0]) g[0] = std::move(ga);
  if (wanted[1]) g[1] = eager::sum_to(gb, b.shape());
  return g;
}

// One member's shape of an operand.
Shape member_shape(const Array& x, bool batched) {
  return batched ? Shape(x.shape().begin() + 1, x.shape().end()) : x.shape();
}

// Whether b broadcasts against a as the element-wise ops allow: a's shape, one element, or a's trailing axes.
bool broadcasts(const Shape& a, const Shape& b) {
  if (num_elements(b) == 1 && b.size() <= a.size()) return true;
  return b.size() <= a.size() && std::equal(b.begin(), b.end(), a.end() - static_cast<std::ptrdiff_t>(b.size()));
}

// The members' a and b in one call: a stacked (repeated when every member reads it), and b as it is when it
// broadcasts against the stacked a, else stacked to a's stacked shape.
std::vector<Array> Binary::batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const {
  const Shape a = member_shape(*in[0], batched[0]), b = member_shape(*in[1], batched[1]);
  if (!broadcasts(a, b)) return Primitive::batch(in, batched, members);  // the op's own error, member by member
  Array full_a = batched[0] ? core::plain_view(*in[0]) : core::broadcast_members(*in[0], members);
  Array full_b;
  if (!batched[1] || a == b) {
    full_b = core::plain_view(*in[1]);
  } else {  // (members, b) with b shorter: its axes moved to the end of a's, then repeated
    Shape lifted(a.size() + 1, 1);
    lifted[0] = members;
    if (num_elements(b) != 1) std::copy(b.begin(), b.end(), lifted.end() - static_cast<std::ptrdiff_t>(b.size()));
    Shape target = a;
    target.insert(target.begin(), members);
    full_b = eager::broadcast_to(core::view_as(*in[1], lifted), target);
  }
  const Array* ptrs[] = {&full_a, &full_b};
  return eval(ptrs);
}

// Operands of one shape, both stacked: element by element, as one array. Otherwise member by member (a
// broadcast operand's cotangent is summed, as vjp sums it for one member).
std::vector<Array> Binary::batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                                     const std::vector<bool>& batched, std::int64_t members) const {
  if (batched[0] && batched[1] && in[0]->shape() == in[1]->shape()) return vjp(in, out, cts, wanted);
  return Primitive::batch_vjp(in, out, cts, wanted, batched, members);
}

class Scale final : public core::Primitive {
 public:
  Scale(float factor, float offset) : factor_(factor), offset_(offset) {}
  std::string name() const override { return "scale"; }
  core::Attributes attributes() const override { return {{"factor", double{factor_}}, {"offset", double{offset_}}}; }
  std::vector<Array> eval(Arrays in) const override {
    std::vector<Array> out;
    out.push_back(eager::scale(*in[0], factor_, offset_));
    return out;
  }
  std::vector<Array> vjp(Arrays, Arrays, Arrays cts, const std::vector<bool>& wanted) const override {
    std::vector<Array> g(1);
    if (wanted[0]) g[0] = scale(*cts[0], factor_);
    return g;
  }
  std::vector<Array> batch(Arrays in, const std::vector<bool>&, std::int64_t) const override { return eval(in); }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& wanted,
                               const std::vector<bool>&, std::int64_t) const override {
    return vjp(in, out, cts, wanted);
  }

 private:
  float factor_, offset_;
};

Array unary(UnaryOp op, const Array& x) { return core::apply1(std::make_shared<Unary>(op), {&x}); }
Array binary(BinaryOp op, const Array& a, const Array& b) {
  return core::apply1(std::make_shared<Binary>(op), {&a, &b});
}

}  // namespace

Array add(const Array& a, const Array& b) { return binary(BinaryOp::add, a, b); }
Array subtract(const Array& a, const Array& b) { return binary(BinaryOp::subtract, a, b); }
Array multiply(const Array& a, const Array& b) { return binary(BinaryOp::multiply, a, b); }
Array divide(const Array& a, const Array& b) { return binary(BinaryOp::divide, a, b); }
Array maximum(const Array& a, const Array& b) { return binary(BinaryOp::maximum, a, b); }
Array minimum(const Array& a, const Array& b) { return binary(BinaryOp::minimum, a, b); }
Array scale(const Array& x, float factor, float offset) {
  return core::apply1(std::make_shared<Scale>(factor, offset), {&x});
}
Array negative(const Array& x) { return unary(UnaryOp::negative, x); }
Array abs(const Array& x) { return unary(UnaryOp::abs, x); }
Array square(const Array& x) { return unary(UnaryOp::square, x); }
Array sqrt(const Array& x) { return unary(UnaryOp::sqrt, x); }
Array exp(const Array& x) { return unary(UnaryOp::exp, x); }
Array log(const Array& x) { return unary(UnaryOp::log, x); }
Array relu(const Array& x) { return unary(UnaryOp::relu, x); }
Array sigmoid(const Array& x) { return unary(UnaryOp::sigmoid, x); }
Array tanh(const Array& x) { return unary(UnaryOp::tanh, x); }

Array gelu(const Array& x) {
  const float c = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));
  Array inner = scale(add(x, scale(multiply(square(x), x), 0.044715f)), c);
  return multiply(scale(x, 0.5f), scale(tanh(inner), 1.0f, 1.0f));
}

}  // namespace pmap::ops
