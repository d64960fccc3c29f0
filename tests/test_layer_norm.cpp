// nn::LayerNorm (pmapcc/nn/layer_norm.h), the layer added as a user would add one, of pmap::ops alone: its
// values against host arithmetic in double, its gradients against central differences, its summary row, and
// every error. (Its ONNX export is checked with ONNX Runtime in tests/test_onnx_export.cpp's zoo.)
#include "grad_checks.h"

#include <cmath>
#include <string>
#include <vector>

#include <pmapcc/core/jit.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/nn/layer_norm.h>
#include <pmapcc/nn/summary.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::random_floats;
using grad_checks::host;
using pmap::Array;
using pmap::Shape;
namespace nn = pmap::nn;
namespace ops = pmap::ops;

// LayerNorm of x (rows, f) in double: (x - mean) / sqrt(var + eps) * scale + bias per row.
std::vector<double> layer_norm(const std::vector<float>& x, int rows, int f, const std::vector<float>& scale,
                               const std::vector<float>& bias, double eps) {
  std::vector<double> y(x.size());
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + static_cast<std::size_t>(r) * f;
    double mean = 0, var = 0;
    for (int k = 0; k < f; ++k) mean += row[k];
    mean /= f;
    for (int k = 0; k < f; ++k) var += (row[k] - mean) * (row[k] - mean);
    var /= f;
    for (int k = 0; k < f; ++k)
      y[static_cast<std::size_t>(r) * f + k] = (row[k] - mean) / std::sqrt(var + eps) * scale[k] + bias[k];
  }
  return y;
}

}  // namespace

TEST_CASE("nn: LayerNorm normalizes each row over its features, then scales and shifts it, as in double") {
  const nn::LayerNorm norm;
  const nn::LayerNormParams fresh = norm.init(7);
  CHECK(fresh.scale.to_vector<float>() == std::vector<float>(7, 1.0f));
  CHECK(fresh.bias.to_vector<float>() == std::vector<float>(7, 0.0f));
  // Rows of (2, 3, 7): every axis but the last is a row. Offsets and spreads that differ by row.
  std::vector<float> x = random_floats(42, 5, -1.0f, 1.0f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = x[i] * static_cast<float>(1 + i / 7) + static_cast<float>(i / 7);
  const Array xs = host(x, {2, 3, 7});
  SUBCASE("fresh parameters: mean 0 and variance var / (var + epsilon) per row") {
    const auto y = norm(fresh, xs).to_vector<float>();
    for (int r = 0; r < 6; ++r) {
      double mean = 0, square = 0;
      for (int k = 0; k < 7; ++k) {
        const double v = y[static_cast<std::size_t>(r * 7 + k)];
        mean += v, square += v * v;
      }
      CAPTURE(r);
      CHECK(std::abs(mean / 7) < 1e-6);
      CHECK(square / 7 == doctest::Approx(1.0).epsilon(1e-5));  // var >> epsilon here
    }
  }
  SUBCASE("drawn scale and bias, and Keras's epsilon: within float rounding of the double formula") {
    const std::vector<float> scale = random_floats(7, 6, 0.5f, 2.0f), bias = random_floats(7, 7, -1.0f, 1.0f);
    const nn::LayerNorm keras{.epsilon = 1e-3f};
    const auto y = keras({host(scale, {7}), host(bias, {7})}, xs).to_vector<float>();
    const auto want = layer_norm(x, 6, 7, scale, bias, 1e-3f);
    REQUIRE(y.size() == want.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      CAPTURE(i);
      CHECK(std::abs(y[i] - want[i]) <= 2e-6 * (1 + std::abs(want[i])));
    }
    // A constant row: no spread, so every value is the bias (the epsilon keeps it finite).
    const auto flat = keras({host(scale, {7}), host(bias, {7})}, host(std::vector<float>(7, 3.5f), {1, 7}));
    CHECK(flat.to_vector<float>() == bias);
  }
}

TEST_CASE("nn: LayerNorm's gradients in x, scale and bias follow central differences, and its summary row") {
  const nn::LayerNorm norm{.epsilon = 1e-3f};
  grad_checks::check_against_differences({"layer_norm", {{3, 5}, {5}, {5}}, [&](const std::vector<Array>& a) {
    return grad_checks::weighted(norm({a[1].copy(), a[2].copy()}, a[0]));  // copies, which grad follows
  }});
  // Only x's spread matters: a gradient in x sums to 0 over each row (a shift of the row changes nothing).
  const Array x = host(random_floats(15, 8), {3, 5});
  const nn::LayerNormParams p = norm.init(5);
  const Array gx = pmap::grad([&](const Array& in) { return grad_checks::weighted(norm(p, in)); })(x);
  const auto g = gx.to_vector<float>();
  for (int r = 0; r < 3; ++r) {
    double s = 0, size = 0;
    for (int k = 0; k < 5; ++k) {
      const double v = g[static_cast<std::size_t>(r * 5 + k)];
      s += v, size += std::abs(v);
    }
    CAPTURE(r);
    CHECK(size > 0.1);
    CHECK(std::abs(s) < 1e-5 * size);
  }
  nn::ModuleRecorder recorder;
  const Array y = norm(p, x);
  REQUIRE(recorder.calls().size() == 1);
  CHECK(recorder.calls()[0].kind == "LayerNormalization");
  CHECK(recorder.calls()[0].tensors.size() == 2);
  CHECK(recorder.calls()[0].output == y.shape());
}

TEST_CASE("nn: LayerNorm under vmap over stacked members and under jit gives each member's own call, bit for bit") {
  const nn::LayerNorm norm{.epsilon = 1e-3f};
  const int members = 3;
  const Array xs = host(random_floats(members * 4 * 6, 21), {members, 4, 6});
  const nn::LayerNormParams stacked{host(random_floats(members * 6, 22, 0.5f, 1.5f), {members, 6}),
                                    host(random_floats(members * 6, 23), {members, 6})};
  const Array batched = pmap::vmap([&](const nn::LayerNormParams& p, const Array& x) { return norm(p, x); },
                                   {0, 0}, "layer_norm")(stacked, xs);
  auto jitted = pmap::jit([&](const nn::LayerNormParams& p, const Array& x) { return norm(p, x); }, "layer_norm");
  REQUIRE(batched.shape() == xs.shape());
  const auto all = batched.to_vector<float>();
  for (int m = 0; m < members; ++m) {
    CAPTURE(m);
    const auto row = [&](const Array& a) { return ops::reshape(ops::slice(a, {m, 0}, {m + 1, 6}), {6}); };
    const nn::LayerNormParams own{row(stacked.scale), row(stacked.bias)};
    const Array x = ops::reshape(ops::slice(xs, {m, 0, 0}, {m + 1, 4, 6}), {4, 6});
    const auto want = norm(own, x).to_vector<float>();
    const auto got = std::vector<float>(all.begin() + m * 24, all.begin() + (m + 1) * 24);
    CHECK(got == want);
    for (int replay = 0; replay < 2; ++replay) CHECK(jitted(own, x).to_vector<float>() == want);  // trace, replay
  }
}

TEST_CASE("nn: LayerNorm's errors name nn::LayerNorm and what is wrong") {
  const nn::LayerNorm norm;
  const Array x = host(std::vector<float>(6, 1.0f), {2, 3});
  CHECK_THROWS_WITH_AS(norm(norm.init(4), x), "nn::LayerNorm: scale must be (3,) (x's last axis), got (4,)",
                       pmap::ShapeError);
  nn::LayerNormParams p = norm.init(3);
  p.bias = host({0, 0}, {2});
  CHECK_THROWS_WITH_AS(norm(p, x), "nn::LayerNorm: bias must be (3,) (x's last axis), got (2,)", pmap::ShapeError);
  CHECK_THROWS_WITH_AS(norm(norm.init(1), host({2.0f}, {})),
                       doctest::Contains("x must have a feature axis, got shape ()"), pmap::ShapeError);
  CHECK_THROWS_WITH_AS(nn::LayerNorm{.epsilon = 0.0f}(norm.init(3), x), doctest::Contains("epsilon must be positive"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(nn::LayerNorm{.epsilon = NAN}(norm.init(3), x), doctest::Contains("epsilon must be positive"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(norm.init(0), "nn::LayerNorm: features must be positive, got 0", pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
