// Per-element random math shared by the host samplers (src/random.cpp) and CUDA kernels: Philox4x32-10
// in cuRAND's host-generator order, cuRAND's u32 -> float conversions and Box-Muller, and libm-free
// exp / log / erf / erfinv so that truncated normals round identically on host and device.
#pragma once

#include <math.h>  // logf, sinf, cosf, sqrtf, sqrt: host (glibc) and device (CUDA) overloads

#include <cstdint>

#include <pmap/detail/launch.h>  // PMAPCC_HD

namespace pmap::detail {

// ---- Philox4x32-10 -------------------------------------------------------------------------------

struct Philox4 { std::uint32_t v[4]; };

// One Philox4x32 round: two 32x32->64 multiplies, then the words are mixed with the round key.
PMAPCC_HD inline Philox4 philox_round(Philox4 c, std::uint32_t k0, std::uint32_t k1) {
  const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * c.v[0];
  const std::uint64_t p1 = std::uint64_t{0xCD9E8D57u} * c.v[2];
  return Philox4{{static_cast<std::uint32_t>(p1 >> 32) ^ c.v[1] ^ k0, static_cast<std::uint32_t>(p1),
                  static_cast<std::uint32_t>(p0 >> 32) ^ c.v[3] ^ k1, static_cast<std::uint32_t>(p0)}};
}

// Philox4x32 with 10 rounds; the key is bumped by the Weyl constants between rounds.
PMAPCC_HD inline Philox4 philox4x32_10(Philox4 counter, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
    counter = philox_round(counter, k0, k1);
  }
  return counter;
}

// cuRAND's host generator (CURAND_RNG_PSEUDO_PHILOX4_32_10, default ordering, offset 0) writes output
// element j from block b = j / 4, word j % 4. Block b is Philox of the counter
//   (b / 65536 as 64 bits in words 0-1, b % 65536 in word 2, 0 in word 3)
// under the key (seed low 32 bits, seed high 32 bits): 65536 subsequences, interleaved block by block.
// Found empirically against libcurand 13.0 (checked to 2^26 + 1 elements; tests/test_random.cpp keeps
// sizes up to 262147, past the first wrap of the subsequences).
inline constexpr std::uint64_t kCurandHostSubsequences = 65536;

// Block `block` (4 words) of cuRAND's host-generator stream for `seed`.
PMAPCC_HD inline Philox4 curand_host_block(std::uint64_t seed, std::uint64_t block) {
  const std::uint64_t offset = block / kCurandHostSubsequences;
  const std::uint64_t subsequence = block % kCurandHostSubsequences;
  const Philox4 counter{{static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(offset >> 32),
                         static_cast<std::uint32_t>(subsequence), 0u}};
  return philox4x32_10(counter, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// ---- cuRAND's conversions ---------------------------------------------------------------------------

inline constexpr float kInv2Pow32 = 2.3283064e-10f;             // cuRAND's float 2^-32
inline constexpr float kInv2Pow32TwoPi = kInv2Pow32 * 6.2831855f;  // 2^-32 * 2 pi, rounded to float

// u32 -> float uniform in (0, 1], as curandGenerateUniform: x * 2^-32 + 2^-33 in float arithmetic
// (x is first rounded to float; values near 2^32 round to exactly 1.0f).
PMAPCC_HD inline float uniform_from_bits(std::uint32_t x) {
  const float scaled = static_cast<float>(x) * kInv2Pow32;
  return scaled + kInv2Pow32 / 2.0f;
}

struct Float2 { float x, y; };

// Box-Muller as cuRAND's host generator: radius from x, angle from y, (sin, cos) order. Uses logf,
// sinf and cosf, so host (glibc) and device (CUDA) results agree only to a few ulp.
PMAPCC_HD inline Float2 box_muller(std::uint32_t x, std::uint32_t y) {
  const float u = uniform_from_bits(x);
  const float v = static_cast<float>(y) * kInv2Pow32TwoPi + kInv2Pow32TwoPi / 2.0f;
  const float radius = sqrtf(-2.0f * logf(u));
  return Float2{sinf(v) * radius, cosf(v) * radius};
}

// Our transforms of cuRAND's outputs, spelled once so kernels round the same way (no FMA contraction).
PMAPCC_HD inline float uniform_in_range(float u, float lo, float hi) {  // u in (0, 1] -> [lo, hi]
  const float x = lo + (hi - lo) * u;
  return x < lo ? lo : (x > hi ? hi : x);
}
PMAPCC_HD inline float scale_normal(float z, float mean, float stddev) { return z * stddev + mean; }

// ---- Bit-exact special functions --------------------------------------------------------------------
// Double precision, written with + - * / and sqrt only (all correctly rounded in IEEE arithmetic),
// so host code compiled with -ffp-contract=off and device code compiled with -fmad=false produce the
// same bits. Relative error is below ~1e-13 on the ranges used (tests/test_random.cpp checks).
namespace bitexact {

inline constexpr double kLn2Hi = 0.693147182464599609375;   // ln 2 rounded to 24 bits: e * kLn2Hi is exact
inline constexpr double kLn2Lo = -1.9046542999577679e-09;   // ln 2 - kLn2Hi
inline constexpr double kInvLn2 = 1.4426950408889634;
inline constexpr double kSqrtPi = 1.7724538509055160;
inline constexpr double kTwoOverSqrtPi = 1.1283791670955126;
inline constexpr double kSqrt2 = 1.4142135623730951;
inline constexpr double kSqrtHalf = 0.70710678118654752;

// 2^k, exact for -1074 <= k <= 1023 (products of exact powers of two).
PMAPCC_HD inline double pow2(int k) {
  double base = k < 0 ? 0.5 : 2.0, result = 1.0;
  for (unsigned n = static_cast<unsigned>(k < 0 ? -k : k); n != 0; n >>= 1, base *= base) {
    if (n & 1u) result *= base;
  }
  return result;
}

// e^x; 0 below -745 (under the smallest subnormal). Domain: x <= 709.
PMAPCC_HD inline double exp(double x) {
  if (x < -745.0) return 0.0;
  const int k = static_cast<int>(x * kInvLn2 + (x < 0 ? -0.5 : 0.5));  // nearest integer to x / ln 2
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;                        // |r| <= ~0.35
  double taylor = 1.0;  // 1 + r(1 + r/2(1 + r/3(...))); r / n is off the dependency chain
  for (int n = 14; n >= 1; --n) taylor = 1.0 + taylor * (r / n);
  return k < -1022 ? taylor * pow2(k + 60) * pow2(-60) : taylor * pow2(k);
}

// Natural logarithm for positive normal x (x <= 0 returns -1e300).
PMAPCC_HD inline double log(double x) {
  if (!(x > 0.0)) return -1e300;
  // Exact reduction x = m * 2^e with m in [sqrt(1/2), sqrt(2)): binary search on the exponent.
  const double up[10] = {0x1p512, 0x1p256, 0x1p128, 0x1p64, 0x1p32, 0x1p16, 0x1p8, 0x1p4, 0x1p2, 0x1p1};
  const double down[10] = {0x1p-512, 0x1p-256, 0x1p-128, 0x1p-64, 0x1p-32,
                           0x1p-16,  0x1p-8,   0x1p-4,   0x1p-2,  0x1p-1};
  double m = x;
  int e = 0;
  for (int i = 0, s = 512; i < 10; ++i, s /= 2) {
    if (m >= up[i]) {
      m *= down[i];
      e += s;
    } else if (m < down[i]) {
      m *= up[i];
      e -= s;
    }
  }
  if (m < kSqrtHalf) {
    m *= 2.0;
    e -= 1;
  } else if (m >= kSqrt2) {
    m *= 0.5;
    e += 1;
  }
  // log m = 2 atanh(t), t = (m - 1) / (m + 1), |t| <= 0.172: odd series to t^25.
  const double t = (m - 1.0) / (m + 1.0), t2 = t * t;
  double series = 1.0 / 25.0;
  for (int k = 23; k >= 1; k -= 2) series = 1.0 / k + t2 * series;
  return e * kLn2Hi + (e * kLn2Lo + 2.0 * t * series);
}

// erfc(a) for a >= 2 by its continued fraction e^{-a^2} / sqrt(pi) / (a + (1/2)/(a + 1/(a + (3/2)/...))),
// cut at 8 + 240 / a^2 terms (measured: enough for 1e-15 relative for every a >= 2).
PMAPCC_HD inline double erfc_tail(double a) {
  double denominator = a;
  for (int n = 8 + static_cast<int>(240.0 / (a * a)); n >= 1; --n) denominator = a + (0.5 * n) / denominator;
  return exp(-(a * a)) / (kSqrtPi * denominator);
}

// erf(a) for 0 <= a < 2 by its Maclaurin series 2/sqrt(pi) sum (-1)^n a^(2n+1) / (n! (2n+1)).
PMAPCC_HD inline double erf_series(double a) {
  double term = a, sum = a;
  for (int n = 1; n <= 60; ++n) {
    term *= -(a * a) / n;
    const double add = term / (2 * n + 1);
    sum += add;
    if ((add < 0 ? -add : add) < 1e-17 * sum) break;
  }
  return kTwoOverSqrtPi * sum;
}

PMAPCC_HD inline double erf(double x) {
  const double a = x < 0 ? -x : x;
  const double r = a < 2.0 ? erf_series(a) : 1.0 - erfc_tail(a);
  return x < 0 ? -r : r;
}

PMAPCC_HD inline double erfc(double x) { return x < 2.0 ? 1.0 - erf(x) : erfc_tail(x); }

// Starting point for the inverses: Winitzki's closed form, relative error about 2e-3. `w` is
// log(1 - y^2) = log(q (2 - q)) where y = 1 - q.
PMAPCC_HD inline double erfinv_guess(double w) {
  const double a = 0.147, t = 2.0 / (3.14159265358979324 * a) + 0.5 * w;
  return sqrt(sqrt(t * t - w / a) - t);
}

// Halley steps on erf(x) = y (tail = false) or erfc(x) = q (tail = true), for both f''/f' = -2x.
// Convergence is cubic: once a step is below 1e-7 relative, the error left is far below 1e-16, so we
// stop there (at most 5 steps; from the guess's 2e-3 it usually takes 2).
PMAPCC_HD inline double erf_halley(double x, double target, bool tail) {
  for (int i = 0; i < 5; ++i) {
    const double slope = kTwoOverSqrtPi * exp(-(x * x));  // |d erf / dx|
    const double ratio = tail ? (target - erfc(x)) / slope : (erf(x) - target) / slope;  // f / f'
    const double step = ratio / (1.0 + x * ratio);
    x -= step;
    if ((step < 0 ? -step : step) <= 1e-7 * (x < 0 ? -x : x)) break;
  }
  return x;
}

// Inverse of erfc on (0, 2); q <= 0 gives 27 and q >= 2 gives -27 (erfc(27) is below 1e-318).
PMAPCC_HD inline double erfcinv(double q) {
  if (!(q > 0.0)) return 27.0;
  if (q >= 2.0) return -27.0;
  const bool negative = q > 1.0;  // erfcinv(q) = -erfcinv(2 - q); 2 - q is exact for q in [1, 2]
  if (negative) q = 2.0 - q;
  const double guess = erfinv_guess(log(q * (2.0 - q)));
  // For q >= 1/2, 1 - q is exact and erf(x) = 1 - q is the better-conditioned equation.
  const double x = q >= 0.5 ? erf_halley(guess, 1.0 - q, false) : erf_halley(guess, q, true);
  return negative ? -x : x;
}

// Inverse of erf on (-1, 1); +-1 give +-27.
PMAPCC_HD inline double erfinv(double y) {
  const double a = y < 0 ? -y : y;
  const double x = a <= 0.5 ? erf_halley(erfinv_guess(log((1.0 - a) * (1.0 + a))), a, false)
                            : erfcinv(1.0 - a);  // 1 - a is exact for a >= 0.5
  return y < 0 ? -x : x;
}

}  // namespace bitexact

// ---- Truncated normal by inverse CDF -----------------------------------------------------------------

// Everything a truncated-normal sampler needs, computed once per call. The interval is mirrored to
// lie mostly left of 0 (lo + hi <= 0) where the normal CDF keeps full relative precision in the tail.
struct TruncatedNormalParams {
  double lo, hi;          // mirrored bounds
  double cdf_lo, cdf_hi;  // standard normal CDF at the (clipped to +-40) mirrored bounds
  bool mirrored;          // samples are negated on the way out
};

// Standard normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2.
PMAPCC_HD inline double normal_cdf(double x) { return 0.5 * bitexact::erfc(-x * bitexact::kSqrtHalf); }

// Inverse of normal_cdf on (0, 1).
PMAPCC_HD inline double normal_quantile(double p) { return -bitexact::kSqrt2 * bitexact::erfcinv(2.0 * p); }

// Requires lower < upper (infinite bounds allowed).
PMAPCC_HD inline TruncatedNormalParams truncated_normal_params(float lower, float upper) {
  const bool mirrored = static_cast<double>(lower) + static_cast<double>(upper) > 0.0;
  const double lo = mirrored ? -static_cast<double>(upper) : static_cast<double>(lower);
  const double hi = mirrored ? -static_cast<double>(lower) : static_cast<double>(upper);
  // Phi(-40) underflows; clipping keeps infinite bounds out of the arithmetic.
  const double cdf_lo = normal_cdf(lo < -40.0 ? -40.0 : lo);
  const double cdf_hi = normal_cdf(hi > 40.0 ? 40.0 : hi);
  return TruncatedNormalParams{lo, hi, cdf_lo, cdf_hi, mirrored};
}

// One standard normal sample restricted to [lower, upper] from a random word: the normal quantile of
// Phi(lower) + u (Phi(upper) - Phi(lower)) with u = (bits + 1/2) 2^-32, exact and strictly inside
// (0, 1), clamped into the bounds against rounding.
PMAPCC_HD inline float truncated_normal_from_bits(std::uint32_t bits, const TruncatedNormalParams& p) {
  const double u = (static_cast<double>(bits) + 0.5) * 0x1p-32;
  const double cdf = p.cdf_lo + u * (p.cdf_hi - p.cdf_lo);
  double x = normal_quantile(cdf);
  if (!(x >= p.lo)) x = p.lo;  // the negated comparisons also catch NaN
  if (!(x <= p.hi)) x = p.hi;
  return static_cast<float>(p.mirrored ? -x : x);
}

}  // namespace pmap::detail
