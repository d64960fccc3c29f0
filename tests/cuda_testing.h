// Helpers of the CUDA tests: the skip guard, random host data, device copies, and the relative error
// every CUDA op is held to against its CPU twin.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <pmap/pmap.h>

// Returns from the test case (after a MESSAGE) when this process has no usable GPU.
#define PMAPCC_REQUIRE_GPU()                 \
  do {                                       \
    if (pmap::cuda_device_count() == 0) {    \
      MESSAGE("no GPU: skipped");            \
      return;                                \
    }                                        \
  } while (0)

namespace cuda_testing {

inline const pmap::Device kGpu{pmap::DeviceKind::cuda, 0, 0};

// n floats uniform in [lo, hi) from a fixed seed.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<std::int32_t> random_labels(std::size_t n, int classes, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, classes - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// A device copy of host values (a 1-D array).
template <class T> pmap::Array on_gpu(const std::vector<T>& v) {
  return pmap::Array::from_host(v, {static_cast<std::int64_t>(v.size())}, kGpu);
}

inline pmap::Array gpu_floats(std::size_t n) { return pmap::Array({static_cast<std::int64_t>(n)}, pmap::DType::f32, kGpu); }

// max |a - b| / max |b|: the error relative to the reference's scale (1 when b is all zero).
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / (scale > 0.0 ? scale : 1.0);
}

inline constexpr double kForwardTolerance = 1e-5;
inline constexpr double kBackwardTolerance = 1e-4;

}  // namespace cuda_testing
