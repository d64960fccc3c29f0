// Helpers for the kernel tests: seeded random buffers, central finite differences in double, a gradient
// comparison that must be able to fail, and bitwise buffer equality.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace kernel_checks {

// n floats uniform in [-scale, scale), fixed by seed.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// sum_i weights[i] * y[i] in double: the scalar objective whose gradient wrt y is weights.
inline double weighted_sum(const std::vector<float>& y, const std::vector<float>& weights) {
  double s = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * weights[i];
  return s;
}

// d objective / d v[i] for every i by central differences. The step is the float-rounded one actually
// taken ((v+h) - (v-h) in double), so rounding of v +- h does not bias the quotient.
inline std::vector<double> numeric_grad(std::vector<float>& v, const std::function<double()>& objective,
                                        float h) {
  std::vector<double> g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float original = v[i];
    v[i] = original + h;
    const double up = objective();
    const double step_up = v[i];
    v[i] = original - h;
    const double down = objective();
    const double step_down = v[i];
    v[i] = original;
    g[i] = (up - down) / (step_up - step_down);
  }
  return g;
}

// Worst |analytic - numeric| in units of tol * max|numeric|: <= 1 means the gradients agree.
inline double grad_error(const std::vector<float>& analytic, const std::vector<double>& numeric, double tol) {
  REQUIRE(analytic.size() == numeric.size());
  double scale = 1e-30;
  for (double g : numeric) scale = std::max(scale, std::abs(g));
  double worst = 0.0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    worst = std::max(worst, std::abs(analytic[i] - numeric[i]) / (tol * scale));
  }
  return worst;
}

// Checks analytic against numeric, then shows the same check fails when one entry is off by 1% of the
// gradient's scale (so tol is tight enough to catch a real bug).
inline void check_grad(const std::string& what, const std::vector<float>& analytic,
                       const std::vector<double>& numeric, double tol = 1e-4) {
  INFO(what);
  const double error = grad_error(analytic, numeric, tol);
  CHECK(error <= 1.0);
  double scale = 0.0;
  for (double g : numeric) scale = std::max(scale, std::abs(g));
  CHECK(scale > 0.0);  // a zero gradient would make the check vacuous
  std::vector<float> wrong = analytic;
  wrong[wrong.size() / 2] += static_cast<float>(0.01 * scale);
  CHECK(grad_error(wrong, numeric, tol) > 1.0);
}

// Max |a - b| relative to max |b|, for forward results against a double reference.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 1e-30, worst = 0.0;
  for (double v : b) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst / scale;
}

// Bitwise equality of count floats.
inline bool same_bits(const float* a, const float* b, std::size_t count) {
  return std::memcmp(a, b, count * sizeof(float)) == 0;
}

}  // namespace kernel_checks
