// The stateful and random primitives of pmap::ops (pmapcc/core/ops.h): BatchNormalization (the kernels'
// four steps around a psum of the sums when an axis is named) and Dropout; VJPs through the kernels'
// backward ops and the same mask.
#include <pmapcc/core/ops.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <pmap/collectives.h>
#include <pmap/error.h>

#include <pmapcc/core/primitive.h>

namespace pmap::ops {
namespace {

using core::Arrays;

// Inputs: x, [gamma], [beta], moving_mean, moving_variance. Outputs: y, the new moving statistics, and the
// statistics used (2, C) (for the VJP).
class BatchNorm final : public core::Primitive {
 public:
  BatchNorm(BatchNormOptions o, bool gamma, bool beta) : o_(std::move(o)), gamma_(gamma), beta_(beta) {}
  std::string name() const override { return "batch_norm"; }
  core::Attributes attributes() const override {
    return {{"train", std::int64_t{o_.train}},
            {"axis_name", o_.axis_name.str()},
            {"epsilon", double{o_.epsilon}},
            {"momentum", double{o_.momentum}},
            {"relu", std::int64_t{o_.relu}},
            {"gamma", std::int64_t{gamma_}},
            {"beta", std::int64_t{beta_}},
            {"batch_examples", o_.batch_examples}};
  }

  std::vector<Array> eval(Arrays in) const override {
    const Array& x = *in[0];
    const Array none;
    const Array& gamma = gamma_ ? *in[1] : none;
    const Array& beta = beta_ ? *in[1 + gamma_] : none;
    Array mean = eager::copy(*in[in.size() - 2]), variance = eager::copy(*in[in.size() - 1]);  // queued: capturable
    Array sums;
    if (o_.train) {
      sums = eager::batch_norm_sums(x);
      if (!o_.axis_name.empty()) sums = psum(sums, o_.axis_name);
    }
    Array stats = eager::batch_norm_statistics(sums, count(x), mean, variance, o_.epsilon, o_.momentum);
    std::vector<Array> out;
    out.push_back(eager::batch_norm_apply(x, stats, gamma, beta, o_.relu));
    out.push_back(std::move(mean));
    out.push_back(std::move(variance));
    out.push_back(std::move(stats));
    return out;
  }

  std::vector<Array> vjp(Arrays in, Arrays out, Arrays cts, const std::vector<bool>& w) const override {
    const Array& x = *in[0];
    const Array none;
    const Array& gamma = gamma_ ? *in[1] : none;
    const Array& stats = *out[3];
    Array masked;
    if (o_.relu) masked = eager::relu_grad(*out[0], *cts[0]);
    const Array& dy = o_.relu ? masked : *cts[0];
    auto sums = eager::batch_norm_backward_sums(x, dy, stats);
    std::vector<Array> g(in.size());
    if (w[0]) {
      if (o_.train) {
        Array whole = o_.axis_name.empty() ? std::move(sums.sums) : psum(sums.sums, o_.axis_name);
        g[0] = eager::batch_norm_backward(x, dy, stats, whole, count(x), gamma);
      } else {  // fixed statistics: dx = dy * inv_std * gamma, batch_norm_apply with a zero mean
        g[0] = eager::batch_norm_apply(dy, eager::multiply(stats, mean_dropped(x.dim(-1), x.device())), gamma, none);
      }
    }
    if (gamma_ && w[1]) g[1] = std::move(sums.dgamma);
    if (beta_ && w[1 + gamma_]) g[1 + gamma_] = std::move(sums.dbeta);
    return g;
  }

 private:
  // The rows the statistics are taken over: this device's, or every device's along the axis.
  double count(const Array& x) const {
    const double rows = static_cast<double>(x.size() / x.dim(-1));
    if (!o_.train || o_.axis_name.empty()) return rows;
    if (o_.batch_examples > 0) return rows / static_cast<double>(x.dim(0)) * static_cast<double>(o_.batch_examples);
    return rows * axis_size(o_.axis_name);
  }
  // (2, C): 0 over the means, 1 over the inverse standard deviations.
  static Array mean_dropped(std::int64_t c, const Device& d) {
    std::vector<float> m(static_cast<std::size_t>(2 * c), 1.0f);
    std::fill(m.begin(), m.begin() + c, 0.0f);
    return Array::from_host(m, {2, c}, d);
  }

  BatchNormOptions o_;
  bool gamma_, beta_;
};

class Dropout final : public core::Primitive {
 public:
  explicit Dropout(DropoutOptions o) : o_(o) {}
  std::string name() const override { return "dropout"; }
  core::Attributes attributes() const override {
    return {{"rate", double{o_.rate}}, {"example_offset", o_.example_offset}, {"stream", std::int64_t{o_.stream}}};
  }
  // in: x, key, step and, when the rate is read from the device, the rate.
  std::vector<Array> eval(Arrays in) const override {
    std::vector<Array> out;
    out.push_back(mask(*in[0], in));
    return out;
  }
  std::vector<Array> vjp(Arrays in, Arrays, Arrays cts, const std::vector<bool>& w) const override {
    std::vector<Array> g(in.size());
    if (w[0]) g[0] = mask(*cts[0], in);
    return g;
  }

 private:
  Array mask(const Array& x, Arrays in) const {
    return in.size() > 3 ? eager::dropout(x, *in[1], *in[2], *in[3], o_) : eager::dropout(x, *in[1], *in[2], o_);
  }
  DropoutOptions o_;
};

}  // namespace

BatchNormResult batch_norm(const Array& x, const Array& gamma, const Array& beta, const Array& moving_mean,
                           const Array& moving_variance, const BatchNormOptions& options) {
  if (options.batch_examples != 0) {
    const std::string given = "ops::batch_norm: batch_examples " + std::to_string(options.batch_examples);
    if (options.batch_examples < 0) throw ValueError(given + " must be >= 0 (0: x.dim(0) times the axis size)");
    if (options.axis_name.empty() || !options.train)
      throw ValueError(given + " counts the examples of every device's batch: it needs train and an axis_name");
    if (!x.valid() || x.ndim() < 2 || options.batch_examples < x.dim(0))
      throw ValueError(given + " needs x (N, ..., C) with N <= " + std::to_string(options.batch_examples) + ", got " +
                       (x.valid() ? x.signature() : std::string("an empty x")));
  }
  std::vector<const Array*> in{&x};
  if (gamma.valid()) in.push_back(&gamma);
  if (beta.valid()) in.push_back(&beta);
  in.push_back(&moving_mean);
  in.push_back(&moving_variance);
  auto out = core::apply(std::make_shared<BatchNorm>(options, gamma.valid(), beta.valid()), std::move(in));
  return {std::move(out[0]), std::move(out[1]), std::move(out[2])};
}

Array dropout(const Array& x, const Array& key, const Array& step, DropoutOptions options) {
  return core::apply1(std::make_shared<Dropout>(options), {&x, &key, &step});
}

Array dropout(const Array& x, const Array& key, const Array& step, const Array& rate, DropoutOptions options) {
  return core::apply1(std::make_shared<Dropout>(options), {&x, &key, &step, &rate});
}

}  // namespace pmap::ops
