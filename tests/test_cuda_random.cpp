// Device sampling: a key draws on the GPU exactly the numbers the host samplers draw (bitwise for bits,
// uniform, bernoulli and truncated normal, to a few ulp for normal), so initial parameters are the same on
// CPU and GPU. The Array samplers on host arrays are the span samplers.
#include "cuda_testing.h"

#include <cstring>
#include <limits>

#include <pmap/random.h>

#if defined(PMAPCC_TEST_CURAND_HOST) && !defined(PMAPCC_CUDA_STANDIN)
#include <curand.h>

#include <pmap/detail/cuda_check.h>
#endif

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using namespace cuda_testing;
using pmap::Key;

const std::vector<Key> kKeys{pmap::key(0), pmap::key(42), pmap::split(pmap::key(7), 3)[2], Key{0xdeadbeefu, 0x01234567u}};
// Not multiples of 4, and 262147, past the wrap of cuRAND's 65536 interleaved subsequences.
const std::vector<std::size_t> kSizes{1, 2, 3, 5, 1001, 4096, 262147};

template <class T> bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

pmap::Array gpu_array(std::size_t n, pmap::DType dtype) {
  return pmap::Array({static_cast<std::int64_t>(n)}, dtype, kGpu);
}

// Largest distance in units in the last place between a and b (equal signs assumed near each other).
std::int64_t max_ulp(const std::vector<float>& a, const std::vector<float>& b) {
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::int32_t ia = 0, ib = 0;
    std::memcpy(&ia, &a[i], 4);
    std::memcpy(&ib, &b[i], 4);
    if (ia < 0) ia = std::numeric_limits<std::int32_t>::min() - ia;  // order negatives below positives
    if (ib < 0) ib = std::numeric_limits<std::int32_t>::min() - ib;
    worst = std::max<std::int64_t>(worst, std::abs(static_cast<std::int64_t>(ia) - ib));
  }
  return worst;
}

}  // namespace

TEST_CASE("cuda device samplers draw the host samplers' numbers for the same key") {
  PMAPCC_REQUIRE_GPU();
  for (const Key& key : kKeys) {
    for (std::size_t n : kSizes) {
      CAPTURE(key);
      CAPTURE(n);
      std::vector<std::uint32_t> bits(n);
      pmap::random_bits(key, bits);
      auto gbits = gpu_array(n, pmap::DType::u32);
      pmap::random_bits(key, gbits);
      CHECK(bitwise_equal(gbits.to_vector<std::uint32_t>(), bits));

      std::vector<float> u(n);
      pmap::uniform(key, u, -0.5f, 3.0f);
      auto gu = gpu_array(n, pmap::DType::f32);
      pmap::uniform(key, gu, -0.5f, 3.0f);
      CHECK(bitwise_equal(gu.to_vector<float>(), u));

      std::vector<float> t(n);
      pmap::truncated_normal(key, t, -2.0f, 2.0f);
      auto gt = gpu_array(n, pmap::DType::f32);
      pmap::truncated_normal(key, gt, -2.0f, 2.0f);
      CHECK(bitwise_equal(gt.to_vector<float>(), t));

      std::vector<std::uint8_t> coin(n);
      pmap::bernoulli(key, coin, 0.3f);
      auto gcoin = gpu_array(n, pmap::DType::u8);
      pmap::bernoulli(key, gcoin, 0.3f);
      CHECK(bitwise_equal(gcoin.to_vector<std::uint8_t>(), coin));

      // Standard normals in ulps: CUDA's logf / sinf / cosf are not glibc's, a few ulp apart.
      std::vector<float> z(n);
      pmap::normal(key, z, 0.0f, 1.0f);
      auto gz = gpu_array(n, pmap::DType::f32);
      pmap::normal(key, gz, 0.0f, 1.0f);
      CHECK(max_ulp(gz.to_vector<float>(), z) <= 16);
      // Scaled and shifted: 0.3 + 1.7 z cancels near 0, where one ulp of z is many ulps of the sample, so
      // the tolerance is absolute, on the scale of z * stddev (16 ulp of z, times 1.7, plus the rounding).
      std::vector<float> s(n);
      pmap::normal(key, s, 0.3f, 1.7f);
      auto gs = gpu_array(n, pmap::DType::f32);
      pmap::normal(key, gs, 0.3f, 1.7f);
      const auto gsh = gs.to_vector<float>();
      std::size_t outside = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double eps = std::numeric_limits<float>::epsilon();
        const double tol = 1.7 * 16 * eps * std::abs(z[i]) + 2 * eps * std::max(0.3, std::abs(static_cast<double>(s[i])));
        outside += std::abs(static_cast<double>(gsh[i]) - s[i]) > tol ? 1 : 0;
      }
      CHECK(outside == 0);
    }
  }
}

TEST_CASE("cuda truncated normals with one-sided and infinite bounds agree bitwise on the device") {
  PMAPCC_REQUIRE_GPU();
  const std::pair<float, float> bounds[] = {{-2.0f, 2.0f}, {0.5f, 3.0f}, {-INFINITY, -1.0f}, {1.0f, INFINITY},
                                            {-INFINITY, INFINITY}, {5.0f, 6.0f}};
  for (auto [lo, hi] : bounds) {
    CAPTURE(lo);
    CAPTURE(hi);
    std::vector<float> t(20011);
    pmap::truncated_normal(pmap::key(3), t, lo, hi);
    auto gt = gpu_array(t.size(), pmap::DType::f32);
    pmap::truncated_normal(pmap::key(3), gt, lo, hi);
    CHECK(bitwise_equal(gt.to_vector<float>(), t));
  }
}

TEST_CASE("cuda device samplers check their arguments and dtypes like the host ones") {
  PMAPCC_REQUIRE_GPU();
  auto f = gpu_array(8, pmap::DType::f32);
  CHECK_THROWS_AS(pmap::uniform(pmap::key(1), f, 1.0f, 1.0f), pmap::ValueError);
  CHECK_THROWS_AS(pmap::truncated_normal(pmap::key(1), f, 2.0f, -2.0f), pmap::ValueError);
  CHECK_THROWS_AS(pmap::random_bits(pmap::key(1), f), pmap::ShapeError);
}

TEST_CASE("Array samplers on host arrays are the span samplers") {
  std::vector<float> t(1001);
  pmap::truncated_normal(pmap::key(9), t);
  pmap::Array a({1001}, pmap::DType::f32);
  pmap::truncated_normal(pmap::key(9), a);
  CHECK(bitwise_equal(a.to_vector<float>(), t));
  std::vector<std::uint32_t> bits(7);
  pmap::random_bits(pmap::key(9), bits);
  pmap::Array b({7}, pmap::DType::u32);
  pmap::random_bits(pmap::key(9), b);
  CHECK(b.to_vector<std::uint32_t>() == bits);
  pmap::Array wrong({3}, pmap::DType::i32);
  CHECK_THROWS_AS(pmap::bernoulli(pmap::key(9), wrong, 0.5f), pmap::ShapeError);
}

// cuRAND's device generator needs a real GPU: the CUDA stand-in (tests/standin) models the runtime and
// cuBLAS, not cuRAND's device code, so this informative comparison is left out of stand-in builds.
#if defined(PMAPCC_TEST_CURAND_HOST) && !defined(PMAPCC_CUDA_STANDIN)

TEST_CASE("cuda: cuRAND's device Philox generator next to ours (informative: WARN, never fails)") {
  PMAPCC_REQUIRE_GPU();
  const std::size_t n = 262147;
  const Key key = pmap::key(42);
  std::uint32_t* words = nullptr;
  PMAPCC_CUDA_CHECK(cudaMalloc(&words, n * sizeof(std::uint32_t)));
  curandGenerator_t gen = nullptr;
  PMAPCC_CURAND_CHECK(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
  PMAPCC_CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(gen, pmap::philox_seed(key)));
  PMAPCC_CURAND_CHECK(curandGenerate(gen, words, n));
  std::vector<std::uint32_t> theirs(n), ours(n);
  PMAPCC_CUDA_CHECK(cudaMemcpy(theirs.data(), words, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
  curandDestroyGenerator(gen);
  cudaFree(words);
  pmap::random_bits(key, ours);
  WARN_MESSAGE(theirs == ours, "cuRAND's device generator orders its Philox stream differently from its host "
                               "generator; pmapcc draws the host generator's stream on both");
}
#endif  // PMAPCC_TEST_CURAND_HOST && !PMAPCC_CUDA_STANDIN

}  // namespace PMAPCC_TEST_FILE
