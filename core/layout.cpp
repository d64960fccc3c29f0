// The axis and layout primitives of pmap::ops (pmapcc/core/ops.h): reductions over axes, transpose,
// broadcast_to, slice, concatenate, log_softmax and max_pool, evaluated through pmap::ops::eager (the
// kernels' LayoutOps); VJPs written in pmap::ops (slice's and max_pool's are the eager kernels' transposes).
#include <pmapcc/core/ops.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <pmap/error.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/primitive.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/layout_ops.h>

namespace pmap::ops {
namespace {

using core::Arrays;
using kernels::ReduceOp;

std::vector<Array> one(Array a) {
  std::vector<Array> v;
  v.push_back(std::move(a));
  return v;
}

// x's shape with 1 at the reduced axes (the axes were checked by eval).
Shape kept_shape(const Shape& x, const std::vector<int>& axes) {
  Shape s = x;
  for (int a : axes) s[static_cast<std::size_t>(a < 0 ? a + static_cast<int>(s.size()) : a)] = 1;
  return s;
}

// An axis of one member's array (ndim axes; negative from the end) as an axis of the stacked array, or -1
// when it is out of range (the member-by-member rule then raises the op's own error).
int stacked_axis(int axis, int ndim) {
  const int a = axis < 0 ? axis + ndim : axis;
  return a < 0 || a >= ndim ? -1 : a + 1;
}

// The batching rules of a primitive whose stacked form is the same primitive with its axes moved past the
// members' (q), or the member-by-member rules where there is none (q null).
std::vector<Array> batch_as(const core::Primitive& p, const core::Primitive* q, Arrays in,
                            const std::vector<bool>& batched, std::int64_t members) {
  return q != nullptr ? q->eval(in) : p.Primitive::batch(in, batched, members);
}
std::vector<Array> batch_vjp_as(const core::Primitive& p, const core::Primitive* q, Arrays in, Arrays out,
                                Arrays cts, const std::vector<bool>& w, const std::vector<bool>& batched,
                                std::int64_t members) {
  return q != nullptr ? q->vjp(in, out, cts, w) : p.Primitive::batch_vjp(in, out, cts, w, batched, members);
}

class ReduceAxes final : public core::Primitive {
 public:
  ReduceAxes(ReduceOp op, std::vector<int> axes, bool keepdims)
      : op_(op), axes_(std::move(axes)), keep_(keepdims) {}
  std::string name() const override { return kernels::to_string(op_); }
  core::Attributes attributes() const override {
    return {{"axes", std::vector<std::int64_t>(axes_.begin(), axes_.end())}, {"keepdims", std::int64_t{keep_}}};
  }
  std::vector<Array> eval(Arrays in) const override {
    switch (op_) {
      case ReduceOp::sum: return one(eager::sum(*in[0], axes_, keep_));
      case ReduceOp::mean: return one(eager::mean(*in[0], axes_, keep_));
      case ReduceOp::max: break;
    }
    return one(eager::max(*in[0], axes_, keep_));
  }
  std::vector<Array> vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (!w[0]) return g;
    const Array& x = *in[0];
    const Shape kept = kept_shape(x.shape(), axes_);
    Array ct = reshape(*cts[0], kept);
    if (op_ == ReduceOp::sum) {
      g[0] = broadcast_to(ct, x.shape());
    } else if (op_ == ReduceOp::mean) {
      const std::int64_t count = x.size() / std::max<std::int64_t>(num_elements(kept), 1);
      g[0] = scale(broadcast_to(ct, x.shape()), 1.0f / static_cast<float>(std::max<std::int64_t>(count, 1)));
    } else {
      g[0] = max_vjp(x, *out[0], ct, kept);
    }
    return g;
  }

 private:
  // The cotangent split evenly among each group's maxima: at_max is 1 where x equals its group's max (the
  // ReLU gradient passes ones where max - x > 0, i.e. below it), then ct / (the maxima's count) spread there.
  Array max_vjp(const Array& x, const Array& y, const Array& ct, const Shape& kept) const {
    Array peak = broadcast_to(reshape(y, kept), x.shape());
    Array below = eager::relu_grad(subtract(peak, x), eager::ones(x.shape(), x.device()));
    Array at_max = scale(below, -1.0f, 1.0f);
    Array share = divide(ct, sum(at_max, axes_, true));
    return multiply(at_max, broadcast_to(share, x.shape()));
  }

 public:
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    return batch_as(*this, shifted(in[0]->ndim() - 1).get(), in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    return batch_vjp_as(*this, shifted(in[0]->ndim() - 1).get(), in, out, cts, w, batched, members);
  }

 private:
  std::unique_ptr<ReduceAxes> shifted(int ndim) const {
    std::vector<int> axes;
    for (int a : axes_) {
      axes.push_back(stacked_axis(a, ndim));
      if (axes.back() < 0) return nullptr;
    }
    return std::make_unique<ReduceAxes>(op_, axes, keep_);
  }

  ReduceOp op_;
  std::vector<int> axes_;
  bool keep_;
};

class Transpose final : public core::Primitive {
 public:
  explicit Transpose(std::vector<int> perm) : perm_(std::move(perm)) {}
  std::string name() const override { return "transpose"; }
  core::Attributes attributes() const override {
    return {{"permutation", std::vector<std::int64_t>(perm_.begin(), perm_.end())}};
  }
  std::vector<Array> eval(Arrays in) const override { return one(eager::transpose(*in[0], perm_)); }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (!w[0]) return g;
    const int n = in[0]->ndim();
    std::vector<int> inverse(perm_.size());
    for (int k = 0; k < n; ++k) {
      const int a = perm_[static_cast<std::size_t>(k)];
      inverse[static_cast<std::size_t>(a < 0 ? a + n : a)] = k;
    }
    g[0] = transpose(*cts[0], inverse);
    return g;
  }
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    return batch_as(*this, shifted(in[0]->ndim() - 1).get(), in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    return batch_vjp_as(*this, shifted(in[0]->ndim() - 1).get(), in, out, cts, w, batched, members);
  }

 private:
  std::unique_ptr<Transpose> shifted(int ndim) const {  // the members' axis stays first
    if (perm_.size() != static_cast<std::size_t>(ndim)) return nullptr;
    std::vector<int> perm{0};
    for (int a : perm_) {
      perm.push_back(stacked_axis(a, ndim));
      if (perm.back() < 0) return nullptr;
    }
    return std::make_unique<Transpose>(perm);
  }
  std::vector<int> perm_;
};

class BroadcastTo final : public core::Primitive {
 public:
  explicit BroadcastTo(Shape shape) : shape_(std::move(shape)) {}
  std::string name() const override { return "broadcast_to"; }
  core::Attributes attributes() const override {
    return {{"shape", std::vector<std::int64_t>(shape_.begin(), shape_.end())}};
  }
  std::vector<Array> eval(Arrays in) const override { return one(eager::broadcast_to(*in[0], shape_)); }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (!w[0]) return g;
    const Shape& xs = in[0]->shape();
    const std::size_t lead = shape_.size() - xs.size();
    std::vector<int> repeated;  // the new leading axes, and x's axes of 1 that were repeated
    for (std::size_t k = 0; k < shape_.size(); ++k) {
      if (k < lead || (xs[k - lead] == 1 && shape_[k] != 1)) repeated.push_back(static_cast<int>(k));
    }
    g[0] = reshape(sum(*cts[0], repeated), xs);
    return g;
  }
  // x (members, s) as (members, 1..., s) with shape's rank, then repeated to (members, shape).
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    if (in[0]->ndim() - 1 > static_cast<int>(shape_.size())) return Primitive::batch(in, batched, members);
    Array x = lifted(*in[0]);
    const Array* ptrs[] = {&x};
    return stacked(members).eval(ptrs);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    if (in[0]->ndim() - 1 > static_cast<int>(shape_.size())) {
      return Primitive::batch_vjp(in, out, cts, w, batched, members);
    }
    Array x = lifted(*in[0]);
    const Array* ptrs[] = {&x};
    std::vector<Array> g = stacked(members).vjp(ptrs, out, cts, w);
    if (g[0].valid()) g[0] = std::move(g[0]).reshape(in[0]->shape());
    return g;
  }

 private:
  Array lifted(const Array& x) const {
    Shape s(shape_.size() + 1, 1);
    s[0] = x.dim(0);
    std::copy(x.shape().begin() + 1, x.shape().end(), s.end() - (x.ndim() - 1));
    return core::view_as(x, s);
  }
  BroadcastTo stacked(std::int64_t members) const {
    Shape s = shape_;
    s.insert(s.begin(), members);
    return BroadcastTo(s);
  }
  Shape shape_;
};

class Slice final : public core::Primitive {
 public:
  Slice(std::vector<std::int64_t> start, std::vector<std::int64_t> stop)
      : start_(std::move(start)), stop_(std::move(stop)) {}
  std::string name() const override { return "slice"; }
  core::Attributes attributes() const override { return {{"start", start_}, {"stop", stop_}}; }
  std::vector<Array> eval(Arrays in) const override { return one(eager::slice(*in[0], start_, stop_)); }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (w[0]) g[0] = eager::slice_backward(*cts[0], in[0]->shape(), start_);
    return g;
  }
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    return batch_as(*this, shifted(in[0]->ndim() - 1, members).get(), in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    return batch_vjp_as(*this, shifted(in[0]->ndim() - 1, members).get(), in, out, cts, w, batched, members);
  }

 private:
  std::unique_ptr<Slice> shifted(int ndim, std::int64_t members) const {  // every member, whole
    if (start_.size() != static_cast<std::size_t>(ndim) || stop_.size() != start_.size()) return nullptr;
    std::vector<std::int64_t> start{0}, stop{members};
    start.insert(start.end(), start_.begin(), start_.end());
    stop.insert(stop.end(), stop_.begin(), stop_.end());
    return std::make_unique<Slice>(start, stop);
  }

  std::vector<std::int64_t> start_, stop_;
};

class Concatenate final : public core::Primitive {
 public:
  explicit Concatenate(int axis) : axis_(axis) {}
  std::string name() const override { return "concatenate"; }
  core::Attributes attributes() const override { return {{"axis", std::int64_t{axis_}}}; }
  std::vector<Array> eval(Arrays in) const override {
    return one(eager::concatenate(std::vector<const Array*>(in.begin(), in.end()), axis_));
  }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    const Array& ct = *cts[0];
    const auto a = static_cast<std::size_t>(axis_ < 0 ? axis_ + ct.ndim() : axis_);
    std::vector<Array> g(in.size());
    std::vector<std::int64_t> start(ct.shape().size(), 0), stop(ct.shape());
    for (std::size_t i = 0; i < in.size(); ++i) {  // each input's part of the cotangent along the axis
      stop[a] = start[a] + in[i]->shape()[a];
      if (w[i]) g[i] = slice(ct, start, stop);
      start[a] = stop[a];
    }
    return g;
  }
  // Every input stacked: along the axis past the members'. Otherwise member by member.
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    return batch_as(*this, shifted(in, batched).get(), in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    return batch_vjp_as(*this, shifted(in, batched).get(), in, out, cts, w, batched, members);
  }

 private:
  std::unique_ptr<Concatenate> shifted(Arrays in, const std::vector<bool>& batched) const {
    for (bool b : batched) {
      if (!b) return nullptr;
    }
    const int a = stacked_axis(axis_, in[0]->ndim() - 1);
    return a < 0 ? nullptr : std::make_unique<Concatenate>(a);
  }
  int axis_;
};

// y = log_softmax(x); dx = g - softmax(x) * rowsum(g), softmax(x) = exp(y).
class LogSoftmax final : public core::Primitive {
 public:
  std::string name() const override { return "log_softmax"; }
  std::vector<Array> eval(Arrays in) const override { return one(eager::log_softmax(*in[0])); }
  std::vector<Array> vjp(Arrays, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (!w[0]) return g;
    const Array &y = *out[0], &ct = *cts[0];
    g[0] = subtract(ct, multiply(exp(y), broadcast_to(sum(ct, {-1}, true), y.shape())));
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

class MaxPool final : public core::Primitive {
 public:
  explicit MaxPool(MaxPoolOptions o) : o_(o) {}
  std::string name() const override { return o_.same ? "max_pool(same)" : "max_pool"; }
  core::Attributes attributes() const override {
    return {{"window_h", std::int64_t{o_.window_h}}, {"window_w", std::int64_t{o_.window_w}},
            {"stride_h", std::int64_t{o_.stride_h}}, {"stride_w", std::int64_t{o_.stride_w}},
            {"same", std::int64_t{o_.same}}};
  }
  std::vector<Array> eval(Arrays in) const override { return one(eager::max_pool(*in[0], o_)); }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(1);
    if (w[0]) g[0] = eager::max_pool_backward(*in[0], *cts[0], o_);
    return g;
  }
  std::vector<Array> batch(Arrays in, const std::vector<bool>& batched, std::int64_t members) const override {
    return core::batch_images(*this, in, batched, members);
  }
  std::vector<Array> batch_vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w,
                               const std::vector<bool>& batched, std::int64_t members) const override {
    return core::batch_images_vjp(*this, in, out, cts, w, batched, members);
  }

 private:
  MaxPoolOptions o_;
};

Array reduce(ReduceOp op, const Array& x, const std::vector<int>& axes, bool keepdims) {
  return core::apply1(std::make_shared<ReduceAxes>(op, axes, keepdims), {&x});
}

}  // namespace

Array sum(const Array& x, const std::vector<int>& axes, bool keepdims) {
  return reduce(ReduceOp::sum, x, axes, keepdims);
}
Array mean(const Array& x, const std::vector<int>& axes, bool keepdims) {
  return reduce(ReduceOp::mean, x, axes, keepdims);
}
Array max(const Array& x, const std::vector<int>& axes, bool keepdims) {
  return reduce(ReduceOp::max, x, axes, keepdims);
}
Array transpose(const Array& x, const std::vector<int>& permutation) {
  return core::apply1(std::make_shared<Transpose>(permutation), {&x});
}
Array broadcast_to(const Array& x, const Shape& shape) {
  return core::apply1(std::make_shared<BroadcastTo>(shape), {&x});
}
Array slice(const Array& x, const std::vector<std::int64_t>& start, const std::vector<std::int64_t>& stop) {
  return core::apply1(std::make_shared<Slice>(start, stop), {&x});
}
Array concatenate(const std::vector<const Array*>& xs, int axis) {
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == nullptr) throw ValueError("ops::concatenate: xs[" + std::to_string(i) + "] is null");
  }
  return core::apply1(std::make_shared<Concatenate>(axis), xs);
}
Array log_softmax(const Array& x) { return core::apply1(std::make_shared<LogSoftmax>(), {&x}); }
Array max_pool(const Array& x, MaxPoolOptions options) {
  return core::apply1(std::make_shared<MaxPool>(options), {&x});
}

}  // namespace pmap::ops
