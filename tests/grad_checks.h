// What the gradient tests share (tests/test_grad.cpp, tests/test_grad_layout.cpp): a scalar function of some
// f32 arrays with the shapes and values to differentiate it at, and the check of its gradient by
// pmap::value_and_grad against central differences of the same f32 function.
#pragma once

#include "cuda_testing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>

namespace grad_checks {

using pmap::Array;
using pmap::Shape;

inline Array host(const std::vector<float>& v, Shape shape) { return Array::from_host(v, std::move(shape)); }

// A scalar function of some f32 arrays, and the shapes and values to differentiate it at.
struct Case {
  std::string name;
  std::vector<Shape> shapes;
  std::function<Array(const std::vector<Array>&)> f;
  float lo = -1.0f, hi = 1.0f;  // the inputs' range
  bool away_from_ties = false;  // inputs whose pairwise differences and values stay > 0.05 from 0
  bool distinct = false;        // each input a shuffled grid of step 0.05 from lo: no two values within 2h
};

inline std::vector<std::vector<float>> inputs_of(const Case& c, std::uint32_t seed) {
  std::vector<std::vector<float>> in;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) {
    const auto n = static_cast<std::size_t>(pmap::num_elements(c.shapes[i]));
    auto v = cuda_testing::random_floats(n, static_cast<std::uint32_t>(seed + 31 * i), c.lo, c.hi);
    if (c.away_from_ties) {  // spread the values on a grid offset per input, so no kink lies within h
      for (std::size_t k = 0; k < v.size(); ++k) v[k] = std::round(v[k] * 8.0f) / 8.0f + 0.03f * (i + 1);
    }
    if (c.distinct) {
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), std::size_t{0});
      std::shuffle(order.begin(), order.end(), std::mt19937(seed + 31 * static_cast<std::uint32_t>(i)));
      for (std::size_t k = 0; k < n; ++k) v[k] = c.lo + 0.05f * static_cast<float>(order[k]);
    }
    in.push_back(std::move(v));
  }
  return in;
}

inline std::vector<Array> arrays(const Case& c, const std::vector<std::vector<float>>& in) {
  std::vector<Array> a;
  for (std::size_t i = 0; i < in.size(); ++i) a.push_back(host(in[i], c.shapes[i]));
  return a;
}

inline double eval(const Case& c, const std::vector<std::vector<float>>& in) {
  return c.f(arrays(c, in)).item<float>();
}

// grad of the case's function at seeded inputs against central differences (h = 1e-2, in f32).
inline void check_against_differences(const Case& c) {
  CAPTURE(c.name);
  const auto in = inputs_of(c, 7);
  auto [value, grads] = pmap::value_and_grad(
      [&](const std::vector<Array>& xs) { return c.f(xs); }, c.name)(arrays(c, in));
  CHECK(value.item<float>() == doctest::Approx(eval(c, in)).epsilon(1e-6));
  REQUIRE(grads.size() == in.size());
  const float h = 1e-2f;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto g = grads[i].to_vector<float>();
    REQUIRE(grads[i].shape() == c.shapes[i]);
    for (std::size_t k = 0; k < in[i].size(); ++k) {
      auto plus = in, minus = in;
      plus[i][k] += h;
      minus[i][k] -= h;
      const double fd = (eval(c, plus) - eval(c, minus)) / (2.0 * h);
      CAPTURE(i);
      CAPTURE(k);
      CHECK(g[k] == doctest::Approx(fd).epsilon(2e-2).scale(1.0));
    }
  }
}

// sum(y * weights): a scalar that weighs every output element differently.
inline Array weighted(const Array& y) {
  const auto w = cuda_testing::random_floats(static_cast<std::size_t>(y.size()), 99, 0.5f, 1.5f);
  return pmap::ops::sum(pmap::ops::multiply(y, Array::from_host(w, y.shape(), y.device())));
}

}  // namespace grad_checks
