// Tests of the CPU dense, relu, softmax cross-entropy and reduction ops: forward against
// naive loops, backward against central finite differences, batched members against single calls.
#include <doctest/doctest.h>
#include <pmap/error.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernel_checks.h"
#include <pmapcc/kernels/cpu_backend.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace kc = kernel_checks;
namespace {
const pmap::kernels::CpuBackend& cpu_ops() { return pmap::kernels::cpu_backend(); }
}  // namespace
using pmap::kernels::DenseParams;
using pmap::kernels::SoftmaxXentParams;

namespace {

struct DenseSizes {
  std::size_t x, w, b, y;
  explicit DenseSizes(const DenseParams& p)
      : x(std::size_t(p.shared_input ? 1 : p.members) * p.batch * p.in_features),
        w(std::size_t(p.members) * p.in_features * p.out_features),
        b(std::size_t(p.members) * p.out_features),
        y(std::size_t(p.members) * p.batch * p.out_features) {}
};

std::vector<double> dense_reference(const DenseParams& p, const std::vector<float>& x,
                                    const std::vector<float>& w, const std::vector<float>& b) {
  const int in = p.in_features, out = p.out_features;
  std::vector<double> y;
  for (int m = 0; m < p.members; ++m)
    for (int n = 0; n < p.batch; ++n)
      for (int o = 0; o < out; ++o) {
        double s = b[m * out + o];
        const std::size_t row = (std::size_t(p.shared_input ? 0 : m) * p.batch + n) * in;
        for (int i = 0; i < in; ++i) s += double(x[row + i]) * w[(std::size_t(m) * in + i) * out + o];
        y.push_back(s);
      }
  return y;
}

}  // namespace

TEST_CASE("dense forward matches the definition and backward matches finite differences") {
  for (bool shared : {false, true}) {
    CAPTURE(shared);
    const DenseParams p{3, 4, 7, 5, shared};
    const DenseSizes size(p);
    std::vector<float> x = kc::random_floats(size.x, 21), w = kc::random_floats(size.w, 22);
    std::vector<float> b = kc::random_floats(size.b, 23), r = kc::random_floats(size.y, 24), y(size.y);
    std::vector<unsigned char> ws(cpu_ops().dense().dense_workspace_bytes(p));
    cpu_ops().dense().dense_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data());
    CHECK(kc::max_rel_diff(y, dense_reference(p, x, w, b)) < 1e-6);
    std::vector<float> dx(size.x), dw(size.w), db(size.b);
    cpu_ops().dense().dense_backward(p, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), ws.data());
    const auto objective = [&] {
      cpu_ops().dense().dense_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data());
      return kc::weighted_sum(y, r);
    };
    kc::check_grad("dense dx", dx, kc::numeric_grad(x, objective, 0.1f));
    kc::check_grad("dense dw", dw, kc::numeric_grad(w, objective, 0.1f));
    kc::check_grad("dense db", db, kc::numeric_grad(b, objective, 0.1f));
  }
}

TEST_CASE("dense with M members equals M single-member calls bitwise") {
  for (bool shared : {false, true}) {
    CAPTURE(shared);
    const DenseParams p{3, 128, 3136, 256, shared};  // the MNIST CNN's first dense layer
    const DenseParams one{1, p.batch, p.in_features, p.out_features, shared};
    const DenseSizes all(p), single(one);
    const auto x = kc::random_floats(all.x, 25), w = kc::random_floats(all.w, 26, 0.05f);
    const auto b = kc::random_floats(all.b, 27), dy = kc::random_floats(all.y, 28);
    std::vector<float> y(all.y), dx(all.x), dw(all.w), db(all.b);
    std::vector<unsigned char> ws(cpu_ops().dense().dense_workspace_bytes(p));  // the single calls allocate their own
    cpu_ops().dense().dense_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data());
    cpu_ops().dense().dense_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), ws.data());
    std::vector<double> dx_sum(single.x, 0.0);
    for (int m = 0; m < p.members; ++m) {
      const float* xm = x.data() + (shared ? 0 : m * single.x);
      std::vector<float> y1(single.y), dx1(single.x), dw1(single.w), db1(single.b);
      cpu_ops().dense().dense_forward(one, xm, w.data() + m * single.w, b.data() + m * single.b, y1.data(), nullptr);
      cpu_ops().dense().dense_backward(one, xm, w.data() + m * single.w, dy.data() + m * single.y, dx1.data(),
                                       dw1.data(), db1.data(), nullptr);
      CHECK(kc::same_bits(y1.data(), y.data() + m * single.y, single.y));
      CHECK(kc::same_bits(dw1.data(), dw.data() + m * single.w, single.w));
      CHECK(kc::same_bits(db1.data(), db.data() + m * single.b, single.b));
      if (!shared) CHECK(kc::same_bits(dx1.data(), dx.data() + m * single.x, single.x));
      for (std::size_t i = 0; i < single.x; ++i) dx_sum[i] += dx1[i];
    }
    if (shared) CHECK(kc::max_rel_diff(dx, dx_sum) < 1e-6);
  }
}

TEST_CASE("relu forward, in place, and backward from the output") {
  // The element-wise ops' relu: unary(UnaryOp::relu) and its activation_backward from the output.
  const pmap::kernels::ElementwiseOps& ew = cpu_ops().elementwise();
  constexpr pmap::kernels::UnaryOp relu = pmap::kernels::UnaryOp::relu;
  std::vector<float> x = kc::random_floats(40, 31);
  for (float& v : x) v += v < 0 ? -0.2f : 0.2f;  // keep away from the kink, where differences are exact
  x[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(x.size());
  ew.unary(relu, x.size(), x.data(), y.data());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i == 3) {
      CHECK(std::isnan(y[i]));
    } else {
      CHECK(y[i] == (x[i] > 0 ? x[i] : 0.0f));
    }
  }
  x[3] = 0.5f;
  ew.unary(relu, x.size(), x.data(), y.data());
  std::vector<float> in_place = x;
  ew.unary(relu, in_place.size(), in_place.data(), in_place.data());
  CHECK(kc::same_bits(in_place.data(), y.data(), y.size()));

  const std::vector<float> r = kc::random_floats(x.size(), 32);
  std::vector<float> dx(x.size());
  ew.activation_backward(relu, x.size(), y.data(), r.data(), dx.data());
  const auto objective = [&] {
    ew.unary(relu, x.size(), x.data(), y.data());
    return kc::weighted_sum(y, r);
  };
  kc::check_grad("relu dx", dx, kc::numeric_grad(x, objective, 0.05f));
  std::vector<float> dx_in_place = r;
  ew.activation_backward(relu, x.size(), y.data(), dx_in_place.data(), dx_in_place.data());
  CHECK(kc::same_bits(dx_in_place.data(), dx.data(), dx.size()));
}

// ---- softmax cross-entropy ------------------------------------------------------------------------------

namespace {

// Loss per member, probabilities and hit counts by the definition, in double.
struct XentReference {
  std::vector<double> loss, probs;
  std::vector<std::int32_t> correct;
};

XentReference xent_reference(const SoftmaxXentParams& p, const std::vector<float>& z,
                             const std::vector<std::int32_t>& labels) {
  XentReference ref;
  for (int m = 0; m < p.members; ++m) {
    double loss = 0.0;
    std::int32_t hits = 0;
    for (int n = 0; n < p.batch; ++n) {
      const float* row = z.data() + (std::size_t(m) * p.batch + n) * p.classes;
      const int label = labels[(p.shared_labels ? 0 : m * p.batch) + n];
      double top = row[0], total = 0.0;
      int argmax = 0;
      for (int k = 1; k < p.classes; ++k) {
        if (row[k] > top) {
          top = row[k];
          argmax = k;
        }
      }
      for (int k = 0; k < p.classes; ++k) total += std::exp(row[k] - top);
      for (int k = 0; k < p.classes; ++k) ref.probs.push_back(std::exp(row[k] - top) / total);
      loss += std::log(total) + top - row[label];
      hits += argmax == label;
    }
    ref.loss.push_back(loss / p.batch);
    ref.correct.push_back(hits);
  }
  return ref;
}

}  // namespace

TEST_CASE("softmax cross-entropy: loss, probabilities, hits and the logits gradient") {
  for (bool shared : {true, false}) {
    CAPTURE(shared);
    const SoftmaxXentParams p{3, 6, 7, shared};
    const std::size_t count = std::size_t(p.members) * p.batch * p.classes;
    std::vector<float> z = kc::random_floats(count, 41, 3.0f);
    std::vector<std::int32_t> labels;
    for (int i = 0; i < p.batch * (shared ? 1 : p.members); ++i) labels.push_back((i * 5 + 2) % p.classes);
    z[2 * p.classes + labels[2]] = 9.0f;  // row 2 of member 0 is a sure hit
    std::vector<float> loss(p.members), dz(count), probs(count);
    std::vector<std::int32_t> correct(p.members);
    cpu_ops().loss().softmax_cross_entropy(p, z.data(), labels.data(), loss.data(), dz.data(), probs.data(),
                                           correct.data(), nullptr, nullptr);
    const XentReference ref = xent_reference(p, z, labels);
    CHECK(kc::max_rel_diff(loss, ref.loss) < 1e-6);
    CHECK(kc::max_rel_diff(probs, ref.probs) < 1e-6);
    CHECK(correct == ref.correct);
    CHECK(correct[0] >= 1);

    // d(sum_m c_m * loss_m)/dz: the gradient of each member's loss, weighted to tell members apart.
    const std::vector<float> c = {1.0f, -2.0f, 0.5f};
    std::vector<float> weighted = dz;
    for (std::size_t i = 0; i < count; ++i) weighted[i] *= c[i / (count / p.members)];
    const auto objective = [&] {
      cpu_ops().loss().softmax_cross_entropy(p, z.data(), labels.data(), loss.data(), nullptr, nullptr, nullptr,
                                             nullptr, nullptr);
      return kc::weighted_sum(loss, c);
    };
    kc::check_grad("softmax_cross_entropy dlogits", weighted, kc::numeric_grad(z, objective, 1e-2f), 1e-3);
  }
}

TEST_CASE("softmax cross-entropy is stable for huge logits and breaks argmax ties to the first index") {
  const SoftmaxXentParams p{1, 2, 3, true};
  const std::vector<float> z = {1e4f, -1e4f, 1e4f, 0.0f, 0.0f, 0.0f};
  const std::vector<std::int32_t> labels = {2, 0};
  std::vector<float> loss(1), dz(6), probs(6);
  std::vector<std::int32_t> correct(1);
  cpu_ops().loss().softmax_cross_entropy(p, z.data(), labels.data(), loss.data(), dz.data(), probs.data(),
                                         correct.data(), nullptr, nullptr);
  // row 0: log 2 (two equal maxima), row 1: log 3 (uniform)
  CHECK(loss[0] == doctest::Approx((std::log(2.0) + std::log(3.0)) / 2).epsilon(1e-6));
  CHECK(probs[0] == doctest::Approx(0.5));
  CHECK(probs[1] == 0.0f);
  CHECK(correct[0] == 1);  // row 0's argmax is 0 (first of the tie), not its label 2; row 1's is 0 == label
  for (float v : dz) CHECK(std::isfinite(v));
  std::vector<float> only_probs(6);
  cpu_ops().loss().softmax_cross_entropy(p, z.data(), nullptr, nullptr, nullptr, only_probs.data(), nullptr, nullptr,
                                         nullptr);
  CHECK(kc::same_bits(only_probs.data(), probs.data(), 6));
  const std::vector<std::int32_t> bad = {0, 3};
  CHECK_THROWS_AS(cpu_ops().loss().softmax_cross_entropy(p, z.data(), bad.data(), loss.data(), nullptr, nullptr,
                                                         nullptr, nullptr, nullptr),
                  pmap::ValueError);
  CHECK_THROWS_AS(cpu_ops().loss().softmax_cross_entropy(p, z.data(), nullptr, loss.data(), nullptr, nullptr, nullptr,
                                                         nullptr, nullptr),
                  pmap::ValueError);
}

TEST_CASE("softmax cross-entropy with M members equals M single-member calls bitwise") {
  const SoftmaxXentParams p{3, 128, 10, true}, one{1, 128, 10, true};
  const std::size_t per = 128 * 10;
  const auto z = kc::random_floats(3 * per, 43, 5.0f);
  std::vector<std::int32_t> labels(128);
  for (int i = 0; i < 128; ++i) labels[i] = (i * 7) % 10;
  std::vector<float> loss(3), dz(3 * per), probs(3 * per);
  std::vector<std::int32_t> correct(3);
  cpu_ops().loss().softmax_cross_entropy(p, z.data(), labels.data(), loss.data(), dz.data(), probs.data(),
                                         correct.data(), nullptr, nullptr);
  for (int m = 0; m < 3; ++m) {
    float loss1 = 0;
    std::vector<float> dz1(per), probs1(per);
    std::int32_t correct1 = 0;
    cpu_ops().loss().softmax_cross_entropy(one, z.data() + m * per, labels.data(), &loss1, dz1.data(), probs1.data(),
                                    &correct1, nullptr, nullptr);
    CHECK(kc::same_bits(&loss1, &loss[m], 1));
    CHECK(kc::same_bits(dz1.data(), dz.data() + m * per, per));
    CHECK(kc::same_bits(probs1.data(), probs.data() + m * per, per));
    CHECK(correct1 == correct[m]);
  }
}

// ---- reductions (the optimizer ops: test_optimizer.cpp)
// ---------------------------------------------------------------------------

TEST_CASE("reduce_sum and reduce_mean per member") {
  const std::size_t n = 1000;
  std::vector<float> x(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = float(i + 1);  // member 0: 1..n, sum n(n+1)/2
    x[n + i] = 0.1f;      // member 1: n * 0.1f, summed in double
  }
  std::vector<float> sum(2), mean(2);
  cpu_ops().loss().reduce_sum(2, n, x.data(), sum.data());
  cpu_ops().loss().reduce_mean(2, n, x.data(), mean.data());
  CHECK(sum[0] == float(n * (n + 1) / 2));
  CHECK(mean[0] == float((n + 1) / 2.0));
  CHECK(sum[1] == float(n * double(0.1f)));
  CHECK_THROWS_AS(cpu_ops().loss().reduce_mean(1, 0, x.data(), mean.data()), pmap::ValueError);
  CHECK_THROWS_AS(cpu_ops().loss().reduce_sum(0, n, x.data(), sum.data()), pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
