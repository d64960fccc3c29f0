// Helpers of the CUDA tests: where they run (the CUDA backend's host run, always; a GPU when one is usable),
// the GPU guard, random host data, arrays on a target, and the relative error every CUDA op is held to
// against its CPU twin. A skipped GPU part is a failure when a GPU is present but unusable, and under
// PMAPCC_REQUIRE_GPU=1 (scripts/gpu_checks.sh), so a GPU run cannot pass by testing nothing.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/kernels/backend.h>

namespace cuda_testing {

// PMAPCC_REQUIRE_GPU=1: every GPU test must run.
inline bool gpu_required() {
  const char* v = std::getenv("PMAPCC_REQUIRE_GPU");
  return v != nullptr && std::string_view(v) == "1";
}

// True when a GPU is usable. Otherwise records why: a MESSAGE for "no GPU" (a failure under
// PMAPCC_REQUIRE_GPU=1), a failed check for a GPU that is present but unusable.
inline bool gpu_usable() {
  const pmap::GpuStatus s = pmap::cuda_status();
  if (s.count > 0) return true;
  if (!s.problem.empty()) {
    FAIL_CHECK("a GPU is present but unusable, so the GPU part of this test cannot run: " << s.problem);
  } else if (gpu_required()) {
    FAIL_CHECK("PMAPCC_REQUIRE_GPU=1 but there is no GPU: the GPU part of this test was skipped");
  } else {
    MESSAGE("no GPU: the GPU part of this test is skipped");
  }
  return false;
}

}  // namespace cuda_testing

// Returns from the test case when no GPU is usable (see gpu_usable: that may be a failure).
#define PMAPCC_REQUIRE_GPU()                   \
  do {                                         \
    if (!cuda_testing::gpu_usable()) return;   \
  } while (0)

namespace cuda_testing {

inline const pmap::Device kGpu{pmap::DeviceKind::cuda, 0, 0};

// Where the CUDA backend is tested: its host run on host memory (always) and the GPU (when usable).
struct Target {
  const char* name;
  const pmap::kernels::Backend* backend;
  pmap::Device device;
};

inline std::vector<Target> targets() {
  std::vector<Target> out{{"host run", &pmap::kernels::cuda_backend_on_host(), pmap::Device{}}};
  if (gpu_usable()) out.push_back({"gpu", &pmap::kernels::backend_for(pmap::DeviceKind::cuda), kGpu});
  return out;
}

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

// A copy of host values (a 1-D array) on `device`.
template <class T> pmap::Array on(const pmap::Device& device, const std::vector<T>& v) {
  return pmap::Array::from_host(v, {static_cast<std::int64_t>(v.size())}, device);
}
template <class T> pmap::Array on_gpu(const std::vector<T>& v) { return on(kGpu, v); }

inline pmap::Array zeros(const pmap::Device& device, std::size_t n, pmap::DType dtype = pmap::DType::f32) {
  return pmap::Array({static_cast<std::int64_t>(n)}, dtype, device);
}
inline pmap::Array gpu_floats(std::size_t n) { return zeros(kGpu, n); }

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
