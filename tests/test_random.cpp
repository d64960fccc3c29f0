// Tests of pmap/random.h: Threefry keys against JAX's published values, the Philox samplers against
// cuRAND's host generator bit for bit, sampler statistics, and the libm-free special functions.
#include <doctest/doctest.h>

#include <pmap/detail/philox.h>
#include <pmap/error.h>
#include <pmap/random.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <numbers>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#ifdef PMAPCC_TEST_CURAND_HOST
#include <curand.h>
#endif

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using pmap::Key;

// The float jax.random.uniform(key) returns for a scalar with partitionable Threefry: the word
// bits0 ^ bits1 of threefry2x32(key, 0, 0), its top 23 bits as the mantissa of a float in [1, 2), minus 1.
float jax_scalar_uniform(Key key) {
  const auto [b0, b1] = pmap::threefry2x32(key, 0, 0);
  return std::bit_cast<float>(((b0 ^ b1) >> 9) | 0x3f800000u) - 1.0f;
}

// Index of the first element whose bits differ, or -1 when a and b are bitwise equal.
template <class T>
long first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<long>(i);
  }
  return -1;
}

struct Moments {
  double mean, variance;
};

Moments moments(const std::vector<float>& x) {
  double sum = 0, sum_sq = 0;
  for (float v : x) sum += v;
  const double mean = sum / static_cast<double>(x.size());
  for (float v : x) sum_sq += (v - mean) * (v - mean);
  return {mean, sum_sq / static_cast<double>(x.size() - 1)};
}

// Checks sample mean and variance against the distribution's mean, variance and 4th central moment,
// each within 5 standard errors.
void check_moments(const std::vector<float>& x, double mean, double variance, double fourth_central) {
  const double n = static_cast<double>(x.size());
  const Moments m = moments(x);
  CHECK(std::abs(m.mean - mean) < 5 * std::sqrt(variance / n));
  CHECK(std::abs(m.variance - variance) < 5 * std::sqrt((fourth_central - variance * variance) / n));
}

double phi(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi); }
double big_phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Raw moments E[X^k], k = 0..4, of a standard normal truncated to [a, b], by the recursion
// m_k = (k - 1) m_{k-2} - (b^{k-1} phi(b) - a^{k-1} phi(a)) / Z, Z = Phi(b) - Phi(a).
std::vector<double> truncated_raw_moments(double a, double b) {
  const double z = big_phi(b) - big_phi(a);
  std::vector<double> m{1.0, -(phi(b) - phi(a)) / z};
  for (int k = 2; k <= 4; ++k) {
    auto tail = [k](double t) { return std::isinf(t) ? 0.0 : std::pow(t, k - 1) * phi(t); };
    const double edge = tail(b) - tail(a);
    m.push_back((k - 1) * m[k - 2] - edge / z);
  }
  return m;
}

void check_truncated(Key key, float lower, float upper) {
  std::vector<float> x(100000);
  pmap::truncated_normal(key, x, lower, upper);
  CHECK(*std::min_element(x.begin(), x.end()) >= lower);
  CHECK(*std::max_element(x.begin(), x.end()) <= upper);
  const std::vector<double> m = truncated_raw_moments(lower, upper);
  const double mean = m[1], var = m[2] - m[1] * m[1];
  const double fourth = m[4] - 4 * mean * m[3] + 6 * mean * mean * m[2] - 3 * mean * mean * mean * mean;
  check_moments(x, mean, var, fourth);
}

// Largest relative error |f(x) - g(x)| / |g(x)| over the grid first, next(first), ... (< last).
template <class Next, class F, class G>
double worst_relative(double first, double last, Next next, F f, G g) {
  double worst = 0;
  for (double x = first; x < last; x = next(x)) {
    if (g(x) != 0) worst = std::max(worst, std::abs(f(x) - g(x)) / std::abs(g(x)));
  }
  return worst;
}

}  // namespace

TEST_CASE("threefry2x32 matches the Random123 known-answer vectors") {
  // Random123's test_threefry.cpp (threefry2x32_20), the vectors JAX's testThreefry2x32 checks.
  CHECK(pmap::threefry2x32(Key{0, 0}, 0, 0) == std::array<std::uint32_t, 2>{0x6b200159u, 0x99ba4efeu});
  CHECK(pmap::threefry2x32(Key{0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu) ==
        std::array<std::uint32_t, 2>{0x1cb996fcu, 0xbb002be7u});
  CHECK(pmap::threefry2x32(Key{0x13198a2eu, 0x03707344u}, 0x243f6a88u, 0x85a308d3u) ==
        std::array<std::uint32_t, 2>{0xc4923a9cu, 0x483df7a0u});
}

TEST_CASE("key, fold_in and split match JAX's published values") {
  // jax tests/random_test.py test_prng_seeds_and_keys (with jax_enable_x64 for the 64-bit seeds).
  CHECK(pmap::key(0) == Key{0, 0});
  CHECK(pmap::key(1) == Key{0, 1});
  CHECK(pmap::key(2147483747u) == Key{0, 2147483747u});
  CHECK(pmap::key(static_cast<std::uint64_t>(-1)) == Key{4294967295u, 4294967295u});
  CHECK(pmap::key(static_cast<std::uint64_t>(-3)) == Key{4294967295u, 4294967293u});
  // jax tests/random_test.py testPRNGValues: fold_in(PRNGKey(0), 4) (fold_in is the same whether or not
  // Threefry is partitionable).
  CHECK(pmap::fold_in(pmap::key(0), 4) == Key{2285895361u, 433833334u});
  // The same test's split(PRNGKey(0), 4) for the legacy, non-partitionable split, which hashes the
  // counters (i, i + 4): it pins threefry2x32 to JAX's numbers. Our split is the partitionable one.
  std::array<std::uint32_t, 2> legacy[4];
  for (std::uint32_t i = 0; i < 4; ++i) legacy[i] = pmap::threefry2x32(pmap::key(0), i, i + 4);
  CHECK(legacy[0][0] == 2285895361u);
  CHECK(legacy[1][0] == 1501764800u);
  CHECK(legacy[2][0] == 1518642379u);
  CHECK(legacy[3][0] == 4090693311u);
  CHECK(legacy[0][1] == 433833334u);
  CHECK(legacy[1][1] == 4221794875u);
  CHECK(legacy[2][1] == 839183663u);
  CHECK(legacy[3][1] == 3740430601u);
  // The jax.random module page (docs.jax.dev, JAX >= 0.5 defaults): random.uniform(key(0)) prints
  // 0.947667 and, after `key, subkey = random.split(key)`, random.uniform(subkey) prints 0.00729382.
  // The tolerances are half a unit in the last printed digit.
  CHECK(std::abs(jax_scalar_uniform(pmap::key(0)) - 0.947667) <= 5e-7);
  CHECK(std::abs(jax_scalar_uniform(pmap::split(pmap::key(0), 2)[1]) - 0.00729382) <= 5e-9);
}

TEST_CASE("split(k, n)[i] == fold_in(k, i), independent of n") {
  const Key root = pmap::fold_in(pmap::key(1701), 3);
  const std::vector<Key> eight = pmap::split(root, 8);
  for (int n : {1, 2, 3, 8, 17}) {
    const std::vector<Key> keys = pmap::split(root, n);
    REQUIRE(keys.size() == static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      CHECK(keys[i] == pmap::fold_in(root, static_cast<std::uint32_t>(i)));
      if (i < 8) CHECK(keys[i] == eight[i]);
    }
  }
  CHECK(eight[0] != eight[1]);
  CHECK_THROWS_WITH_AS(pmap::split(root, 0), doctest::Contains("n=0"), pmap::ValueError);
  CHECK_THROWS_AS(pmap::split(root, -2), pmap::ValueError);
}

TEST_CASE("keys print their words") {
  std::ostringstream os;
  os << Key{1, 4294967295u};
  CHECK(os.str() == "Key(1, 4294967295)");
  CHECK(pmap::philox_seed(Key{1, 2}) == 0x0000000100000002ull);
}

#ifdef PMAPCC_TEST_CURAND_HOST
namespace {

// cuRAND's host-side Philox generator (runs without a GPU), seeded as our samplers seed it.
struct CurandHost {
  curandGenerator_t gen{};
  explicit CurandHost(Key key) {
    REQUIRE(curandCreateGeneratorHost(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10) == CURAND_STATUS_SUCCESS);
    REQUIRE(curandSetPseudoRandomGeneratorSeed(gen, pmap::philox_seed(key)) == CURAND_STATUS_SUCCESS);
  }
  ~CurandHost() { curandDestroyGenerator(gen); }
  CurandHost(const CurandHost&) = delete;
  CurandHost& operator=(const CurandHost&) = delete;
};

const std::vector<Key> kStreamKeys{pmap::key(0), pmap::key(42), pmap::split(pmap::key(7), 3)[2],
                                   Key{0xdeadbeefu, 0x01234567u}};
// Odd sizes, sizes that are not multiples of 4, and 262147, which wraps cuRAND's 65536 subsequences.
const std::vector<std::size_t> kStreamSizes{1, 2, 3, 4, 5, 7, 1001, 4096, 262147};

}  // namespace

TEST_CASE("random_bits, uniform and normal equal cuRAND's host generator bit for bit") {
  for (const Key& key : kStreamKeys) {
    for (std::size_t n : kStreamSizes) {
      CAPTURE(key);
      CAPTURE(n);
      std::vector<std::uint32_t> bits(n), expected_bits(n);
      pmap::random_bits(key, bits);
      REQUIRE(curandGenerate(CurandHost(key).gen, expected_bits.data(), n) == CURAND_STATUS_SUCCESS);
      CHECK(first_difference(bits, expected_bits) == -1);

      std::vector<float> u(n), expected_u(n);
      pmap::uniform(key, u);
      REQUIRE(curandGenerateUniform(CurandHost(key).gen, expected_u.data(), n) == CURAND_STATUS_SUCCESS);
      CHECK(first_difference(u, expected_u) == -1);

      // cuRAND's host generator accepts odd counts for normals and returns the first n of n + 1.
      std::vector<float> z(n), expected_z(n);
      pmap::normal(key, z, 0.3f, 1.7f);
      REQUIRE(curandGenerateNormal(CurandHost(key).gen, expected_z.data(), n, 0.3f, 1.7f) ==
              CURAND_STATUS_SUCCESS);
      CHECK(first_difference(z, expected_z) == -1);
    }
  }
}
#endif  // PMAPCC_TEST_CURAND_HOST

TEST_CASE("samplers are deterministic, prefix-stable, and differ between keys") {
  const Key key = pmap::key(123);
  std::vector<std::uint32_t> a(1000), b(1000), prefix(10), other(1000);
  pmap::random_bits(key, a);
  pmap::random_bits(key, b);
  pmap::random_bits(key, prefix);
  pmap::random_bits(pmap::fold_in(key, 1), other);
  CHECK(a == b);
  CHECK(std::equal(prefix.begin(), prefix.end(), a.begin()));
  CHECK(std::inner_product(a.begin(), a.end(), other.begin(), 0, std::plus<>(), std::equal_to<>()) < 3);

  std::vector<float> t1(999), t2(999), t3(999);
  pmap::truncated_normal(key, t1);
  pmap::truncated_normal(key, t2);
  pmap::truncated_normal(pmap::key(124), t3);
  CHECK(first_difference(t1, t2) == -1);
  CHECK(first_difference(t1, t3) == 0);
}

TEST_CASE("uniform, normal and bernoulli statistics") {
  const std::size_t n = 100000;
  std::vector<float> u(n);
  pmap::uniform(pmap::key(1), u);
  check_moments(u, 0.5, 1.0 / 12, 1.0 / 80);
  CHECK(*std::min_element(u.begin(), u.end()) > 0.0f);
  CHECK(*std::max_element(u.begin(), u.end()) <= 1.0f);

  pmap::uniform(pmap::key(2), u, -3.0f, 5.0f);  // width 8: variance 64 / 12, 4th moment 8^4 / 80
  check_moments(u, 1.0, 64.0 / 12, 4096.0 / 80);
  CHECK(*std::min_element(u.begin(), u.end()) >= -3.0f);
  CHECK(*std::max_element(u.begin(), u.end()) <= 5.0f);

  std::vector<float> z(n);
  pmap::normal(pmap::key(3), z, 2.0f, 3.0f);
  check_moments(z, 2.0, 9.0, 3 * 81.0);

  for (float p : {0.0f, 0.1f, 0.5f, 0.9f, 1.0f}) {
    std::vector<std::uint8_t> b(n);
    pmap::bernoulli(pmap::key(4), b, p);
    const double ones = std::count(b.begin(), b.end(), 1);
    CHECK(std::count_if(b.begin(), b.end(), [](std::uint8_t v) { return v > 1; }) == 0);
    CHECK(std::abs(ones / n - p) <= 5 * std::sqrt(p * (1 - p) / n));
  }
}

TEST_CASE("truncated_normal stays in bounds and has the truncated moments") {
  // Standard normal on [-2, 2]: mean 0, variance 1 - 4 phi(2) / (2 Phi(2) - 1) = 0.7737413.
  const std::vector<double> m = truncated_raw_moments(-2, 2);
  CHECK(m[1] == doctest::Approx(0.0));
  CHECK(m[2] == doctest::Approx(0.7737413).epsilon(1e-6));
  check_truncated(pmap::key(5), -2.0f, 2.0f);
  check_truncated(pmap::key(6), -0.3f, 0.3f);
  check_truncated(pmap::key(7), -1.0f, 3.0f);
  check_truncated(pmap::key(8), 3.0f, 5.0f);     // right tail: sampled mirrored
  check_truncated(pmap::key(9), -6.0f, -4.5f);   // far left tail
  check_truncated(pmap::key(10), 0.0f, INFINITY);  // half-normal
  check_truncated(pmap::key(12), -INFINITY, INFINITY);  // the standard normal

  std::vector<float> x(1000);
  pmap::truncated_normal(pmap::key(11), x, 10.0f, 10.5f);  // probability ~1e-23 region
  CHECK(*std::min_element(x.begin(), x.end()) >= 10.0f);
  CHECK(*std::max_element(x.begin(), x.end()) <= 10.5f);
  pmap::truncated_normal(pmap::key(11), x, 50.0f, 60.0f);  // Phi underflows: clamped into bounds
  CHECK(*std::min_element(x.begin(), x.end()) >= 50.0f);
  CHECK(*std::max_element(x.begin(), x.end()) <= 60.0f);
}

TEST_CASE("libm-free special functions are accurate") {
  namespace bx = pmap::detail::bitexact;
  const auto times = [](double f) { return [f](double x) { return x * f; }; };
  const auto plus = [](double d) { return [d](double x) { return x + d; }; };
  const auto std_log = [](double x) { return std::log(x); };
  const auto std_erf = [](double x) { return std::erf(x); };
  CHECK(worst_relative(1e-300, 1e300, times(1.37), bx::log, std_log) < 1e-14);
  CHECK(worst_relative(0.5, 2.0, plus(1e-3), bx::log, std_log) < 1e-14);  // around log's zero at 1
  CHECK(worst_relative(-700, 700, plus(0.37), bx::exp, [](double x) { return std::exp(x); }) < 1e-14);
  CHECK(worst_relative(-6, 6, plus(1e-3), bx::erf, std_erf) < 1e-13);
  CHECK(worst_relative(-6, 26, plus(1e-2), bx::erfc, [](double x) { return std::erfc(x); }) < 1e-12);
  // erfinv against std::erf: the round trip in y, and in x where erf is well conditioned.
  const auto identity = [](double x) { return x; };
  const auto erf_of_erfinv = [](double y) { return std::erf(bx::erfinv(y)); };
  CHECK(worst_relative(-0.999999, 1.0, plus(1e-4), erf_of_erfinv, identity) < 1e-12);
  CHECK(worst_relative(1e-300, 1.0, times(1.1), erf_of_erfinv, identity) < 1e-12);
  const auto erfinv_of_erf = [](double x) { return bx::erfinv(std::erf(x)); };
  CHECK(worst_relative(-3.5, 3.5, plus(1e-3), erfinv_of_erf, identity) < 1e-9);
  const auto erfc_of_erfcinv = [](double q) { return std::erfc(bx::erfcinv(q)); };
  CHECK(worst_relative(1e-300, 2.0, times(1.1), erfc_of_erfcinv, identity) < 1e-10);
}

TEST_CASE("permutation is a deterministic, unbiased permutation") {
  for (std::uint32_t n : {0u, 1u, 2u, 10u, 1000u}) {
    std::vector<std::uint32_t> p = pmap::permutation(pmap::key(n), n), sorted = p;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::uint32_t> identity(n);
    std::iota(identity.begin(), identity.end(), 0u);
    CHECK(sorted == identity);
    CHECK(p == pmap::permutation(pmap::key(n), n));
  }
  CHECK(pmap::permutation(pmap::key(1), 1000) != pmap::permutation(pmap::key(2), 1000));
  // Each of the 6 permutations of 3 should come up 1/6 of the time over many keys.
  std::map<std::vector<std::uint32_t>, int> counts;
  const int trials = 60000;
  for (int i = 0; i < trials; ++i) ++counts[pmap::permutation(pmap::fold_in(pmap::key(9), i), 3)];
  CHECK(counts.size() == 6);
  const double expected = trials / 6.0, sigma = std::sqrt(trials * (1.0 / 6) * (5.0 / 6));
  for (const auto& [perm, count] : counts) CHECK(std::abs(count - expected) < 5 * sigma);
}

TEST_CASE("samplers reject bad arguments, naming them") {
  std::vector<float> x(4);
  std::vector<std::uint8_t> b(4);
  const Key k = pmap::key(0);
  CHECK_THROWS_WITH_AS(pmap::uniform(k, x, 1.0f, 1.0f), doctest::Contains("lo=1, hi=1"), pmap::ValueError);
  CHECK_THROWS_AS(pmap::uniform(k, x, 0.0f, INFINITY), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::normal(k, x, 0.0f, 0.0f), doctest::Contains("stddev=0"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::normal(k, x, NAN, 1.0f), doctest::Contains("mean=nan"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::truncated_normal(k, x, 2.0f, -2.0f), doctest::Contains("lower=2, upper=-2"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::bernoulli(k, b, 1.5f), doctest::Contains("p=1.5"), pmap::ValueError);
  CHECK_THROWS_AS(pmap::bernoulli(k, b, -0.1f), pmap::ValueError);
  CHECK_THROWS_AS(pmap::bernoulli(k, b, NAN), pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
