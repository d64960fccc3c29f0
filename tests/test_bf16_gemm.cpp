// The bf16 GEMM of mixed precision (kernels/cpu/shared/bf16_gemm.h): its rounding against the CPU's own conversion
// instruction, its products against a float64 product of the rounded operands for every operand layout and
// shapes that cross each block edge, accumulation, reproducibility and its refusals.
#include <doctest/doctest.h>

#include <pmap/error.h>

#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

namespace bf16 = pmap::kernels::bf16;

float from_bits(std::uint32_t u) {
  float x = 0;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

std::uint32_t to_bits(float x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// The CPU's conversion (vcvtneps2bf16) of 16 floats.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void hardware_round(const float* x,
                                                                                    std::uint16_t* out) {
  const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x));
  std::memcpy(out, &v, 32);
}

// m (rows, cols) row-major, stored as itself or (transposed) as its transpose.
std::vector<float> stored(const std::vector<float>& m, long rows, long cols, bool transposed) {
  if (!transposed) return m;
  std::vector<float> t(m.size());
  for (long i = 0; i < rows; ++i)
    for (long j = 0; j < cols; ++j)
      t[static_cast<std::size_t>(j * rows + i)] = m[static_cast<std::size_t>(i * cols + j)];
  return t;
}

std::vector<float> random_matrix(long n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

struct Product {
  std::vector<float> c;
  std::vector<unsigned char> pack;
};

void run(bf16::Path path, long rows, long cols, long depth, const std::vector<float>& a, bool at,
         const std::vector<float>& b, bool bt, std::vector<float>& c, bool accumulate) {
  std::vector<unsigned char> pack(bf16::gemm_pack_bytes(rows, cols, depth));
  const auto as = stored(a, rows, depth, at), bs = stored(b, depth, cols, bt);
  bf16::gemm(path, rows, cols, depth, {as.data(), at}, {bs.data(), bt}, c.data(), accumulate, pack.data(),
             pack.size());
}

// The paths this CPU runs (a message for each it does not).
std::vector<bf16::Path> paths() {
  std::vector<bf16::Path> out;
  for (bf16::Path p : {bf16::Path::amx, bf16::Path::avx512, bf16::Path::fma}) {
    if (bf16::supported(p)) {
      out.push_back(p);
    } else {
      MESSAGE("this CPU does not run the bf16 GEMM's " << bf16::name(p) << " path: not checked here");
    }
  }
  return out;
}

}  // namespace

TEST_CASE("bf16 rounding is the CPU's conversion instruction's, bit for bit") {
  // Ties both ways, the largest finite values, infinities, NaNs with payloads, subnormals, signed zeros.
  std::vector<std::uint32_t> bits = {0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x3F807FFFu, 0x7F7FFFFFu, 0xFF7FFFFFu,
                                     0x7F7F8000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u, 0xFFA12345u,
                                     0x00000001u, 0x807FFFFFu, 0x00800000u, 0x00000000u, 0x80000000u, 0x3F800000u};
  std::mt19937 rng(7);
  while (bits.size() < 16 * 4096) bits.push_back(static_cast<std::uint32_t>(rng()));
  while (bits.size() % 16 != 0) bits.push_back(0);
  std::vector<float> x(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) x[i] = from_bits(bits[i]);
  // Finite values round to within half a bf16 ulp (at most 2^-8 relative); bf16 values are kept exactly.
  for (float v : {1.0f, -2.5f, 3.140625f, 65280.0f}) CHECK(bf16::round(v) == v);
  CHECK(bf16::round(1.0f + 1.0f / 1024) == 1.0f);
  CHECK(bf16::round(1.0f + 3.0f / 256) == 1.015625f);  // a tie, to the even neighbour above
  CHECK(std::isinf(bf16::round(std::numeric_limits<float>::max())));
  CHECK(std::isnan(bf16::round(std::numeric_limits<float>::quiet_NaN())));
  for (float v : x) {
    if (!std::isfinite(v) || std::fabs(v) < std::numeric_limits<float>::min() || std::fabs(v) > 3e38f) continue;
    REQUIRE(std::fabs(bf16::round(v) - v) <= std::fabs(v) * 0.00390625f);
  }
  if (!bf16::supported()) {
    MESSAGE("this CPU lacks AVX512_BF16: the rounding is not compared with its instruction");
    return;
  }
  std::vector<std::uint16_t> hw(x.size());
  for (std::size_t i = 0; i < x.size(); i += 16) hardware_round(x.data() + i, hw.data() + i);
  int differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (bf16::round_bits(x[i]) == hw[i]) continue;
    if (++differ <= 5) FAIL_CHECK("input bits " << bits[i] << ": ours " << bf16::round_bits(x[i]) << ", CPU " << hw[i]);
  }
  CHECK(differ == 0);
}

TEST_CASE("bf16::round_into rounds a buffer as round() does, any length, also in place") {
  std::mt19937 rng(11);
  std::vector<std::uint32_t> bits = {0x3F808000u, 0x7F800001u, 0xFFA12345u, 0x00000001u, 0x807FFFFFu, 0x80000000u,
                                     0x7F7FFFFFu, 0x3F818000u};
  while (bits.size() < 1000) bits.push_back(static_cast<std::uint32_t>(rng()));
  std::vector<float> x(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) x[i] = from_bits(bits[i]);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
                        std::size_t{999}}) {
    CAPTURE(n);
    std::vector<float> out(n + 3, 5.0f);  // past n stays untouched
    bf16::round_into(x.data(), n, out.data());
    std::vector<float> in_place(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n));
    bf16::round_into(in_place.data(), n, in_place.data());
    int differ = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t want = static_cast<std::uint32_t>(bf16::round_bits(x[i])) << 16;
      differ += to_bits(out[i]) != want || to_bits(in_place[i]) != want;
    }
    CHECK(differ == 0);
    CHECK(std::all_of(out.begin() + static_cast<std::ptrdiff_t>(n), out.end(), [](float v) { return v == 5.0f; }));
  }
}

TEST_CASE("bf16 GEMM: products of the rounded operands summed in fp32, for every path, layout and block edge") {
  for (bf16::Path path : paths()) {
  CAPTURE(bf16::name(path));
  std::mt19937 rng(11);
  // Sizes around the register tiles (8 x 32 on the vector path, 32 x 32 on AMX), rows in steps other than the
  // tile's, several panels of 32 columns, and the blocks (96 rows, 384 deep, 512 columns), odd depths.
  const long shapes[][3] = {{1, 1, 1},     {3, 5, 7},     {8, 32, 2},      {9, 33, 3},     {17, 70, 129},
                            {6, 64, 4},    {7, 96, 9},    {13, 127, 17},   {12, 65, 33},   {96, 64, 384},
                            {97, 31, 385}, {130, 100, 771}, {40, 530, 50}, {128, 10, 3136},
                            {600, 33, 70}};  // rows > 512: the transposed product (AMX) crosses a column block
  for (const auto& s : shapes) {
    const long rows = s[0], cols = s[1], depth = s[2];
    const auto a = random_matrix(rows * depth, rng), b = random_matrix(depth * cols, rng, 0.1f);
    const auto c0 = random_matrix(rows * cols, rng);
    for (int layout = 0; layout < 4; ++layout) {
      const bool at = (layout & 1) != 0, bt = (layout & 2) != 0;
      for (bool accumulate : {false, true}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(depth);
        CAPTURE(at);
        CAPTURE(bt);
        CAPTURE(accumulate);
        std::vector<float> c = c0;
        run(path, rows, cols, depth, a, at, b, bt, c, accumulate);
        double worst = 0;
        for (long i = 0; i < rows; ++i) {
          for (long j = 0; j < cols; ++j) {
            double ref = accumulate ? c0[static_cast<std::size_t>(i * cols + j)] : 0.0, mag = std::fabs(ref);
            for (long k = 0; k < depth; ++k) {
              const double p = static_cast<double>(bf16::round(a[static_cast<std::size_t>(i * depth + k)])) *
                               bf16::round(b[static_cast<std::size_t>(k * cols + j)]);
              ref += p;
              mag += std::fabs(p);
            }
            // fp32 sums of exact products: within (depth + 1) roundings of 2^-24 of the magnitudes' sum.
            const double err = std::fabs(c[static_cast<std::size_t>(i * cols + j)] - ref);
            worst = std::max(worst, err / (mag * (static_cast<double>(depth) + 1) * 0x1p-24 + 1e-30));
          }
        }
        CHECK(worst <= 1.0);
      }
    }
  }
  }
}

TEST_CASE("bf16 GEMM: the operands are rounded, the result is reproducible, and bad calls are refused") {
  if (!bf16::supported()) {
    MESSAGE("this CPU lacks AVX512_BF16: checking that the GEMM refuses to run");
    float a = 1, b = 1, c = 0;
    unsigned char pack[256];
    CHECK_THROWS_WITH_AS(bf16::gemm(1, 1, 1, {&a}, {&b}, &c, false, pack, sizeof pack),
                         doctest::Contains("lacks AVX512_BF16"), pmap::ValueError);
    return;
  }
  if (!bf16::supported(bf16::Path::amx)) {
    float a = 1, b = 1, c = 0;
    unsigned char pack[256];
    CHECK_THROWS_WITH_AS(bf16::gemm(bf16::Path::amx, 1, 1, 1, {&a}, {&b}, &c, false, pack, sizeof pack),
                         doctest::Contains("AMX"), pmap::ValueError);
  }
  CHECK(bf16::supported(bf16::best_path()));
  std::mt19937 rng(3);
  const long rows = 200, cols = 75, depth = 1000;
  const auto a = random_matrix(rows * depth, rng), b = random_matrix(depth * cols, rng);
  std::vector<float> c1(static_cast<std::size_t>(rows * cols), 5.0f);
  for (bf16::Path path : paths()) {
    CAPTURE(bf16::name(path));
    // 1 + 2^-10 and 1 + 2^-9 are not bf16 values: their rounded product is 1, the fp32 product is not.
    const std::vector<float> x = {1.0f + 1.0f / 1024, 3.0f}, y = {1.0f + 1.0f / 512, 0.0f};
    std::vector<float> z = {42.0f};
    run(path, 1, 1, 2, x, false, y, false, z, false);
    CHECK(z[0] == 1.0f);
    // The same call twice gives the same bits.
    std::vector<float> c2(c1.size(), -7.0f);
    run(path, rows, cols, depth, a, false, b, true, c1, false);
    run(path, rows, cols, depth, a, false, b, true, c2, false);
    CHECK(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0);
  }
  run(bf16::active_path(), rows, cols, depth, a, false, b, true, c1, false);  // gemm() without a path: this one
  // A workspace sized for a larger product serves a smaller one, with the same bits.
  std::vector<unsigned char> big(bf16::gemm_pack_bytes(4 * rows, 4 * cols, 4 * depth) + 3);
  CHECK(big.size() > bf16::gemm_pack_bytes(rows, cols, depth));
  const auto bt = stored(b, depth, cols, true);
  std::vector<float> c3(c1.size());
  bf16::gemm(rows, cols, depth, {a.data()}, {bt.data(), true}, c3.data(), false, big.data() + 3, big.size() - 3);
  CHECK(std::memcmp(c1.data(), c3.data(), c1.size() * sizeof(float)) == 0);

  std::vector<unsigned char> small(bf16::gemm_pack_bytes(rows, cols, depth) - 1);
  CHECK_THROWS_WITH_AS(bf16::gemm(rows, cols, depth, {a.data()}, {b.data()}, c3.data(), false, small.data(),
                                  small.size()),
                       doctest::Contains("needs"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(bf16::gemm(rows, cols, depth, {a.data()}, {b.data()}, c3.data(), false, nullptr, 0),
                       doctest::Contains("packing space"), pmap::ValueError);
  CHECK_THROWS_AS(bf16::gemm(-1, cols, depth, {a.data()}, {b.data()}, c3.data(), false, big.data(), big.size()),
                  pmap::ValueError);
  // Empty products: c is zeroed (or left, accumulating), and no packing space is needed.
  std::vector<float> c4 = {3.0f, 4.0f};
  bf16::gemm(1, 2, 0, {a.data()}, {b.data()}, c4.data(), true, nullptr, 0);
  CHECK(c4 == std::vector<float>{3.0f, 4.0f});
  bf16::gemm(1, 2, 0, {a.data()}, {b.data()}, c4.data(), false, nullptr, 0);
  CHECK(c4 == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE("bf16 GEMM paths by name (PMAPCC_BF16_PATH): auto is the best one here, bad names are refused") {
  for (bf16::Path p : {bf16::Path::amx, bf16::Path::avx512, bf16::Path::fma}) {
    CAPTURE(bf16::name(p));
    if (bf16::supported(p)) {
      CHECK(bf16::path_named(bf16::name(p), "X") == p);
    } else {
      const std::string want = std::string("X=") + bf16::name(p) + ": this CPU";
      CHECK_THROWS_WITH_AS(bf16::path_named(bf16::name(p), "X"), doctest::Contains(want.c_str()), pmap::ValueError);
    }
  }
  if (bf16::supported()) {
    CHECK(bf16::path_named("auto", "X") == bf16::best_path());
    CHECK(bf16::path_named("", "X") == bf16::best_path());
    CHECK(bf16::supported(bf16::best_path()));
    CHECK(bf16::active_path() == bf16::path_named(std::getenv("PMAPCC_BF16_PATH") == nullptr
                                                      ? "" : std::getenv("PMAPCC_BF16_PATH"), "X"));
  }
  CHECK_THROWS_WITH_AS(bf16::path_named("avx2", "PMAPCC_BF16_PATH"),
                       doctest::Contains("PMAPCC_BF16_PATH: unknown bf16 GEMM path 'avx2' (expected amx, avx512, fma"),
                       pmap::ValueError);
  CHECK_THROWS_AS(bf16::path_named("AMX", "X"), pmap::ValueError);  // names are exact
}

TEST_CASE("bf16 GEMM on rounded rows: the same bits as on the floats they were rounded from") {
  for (bf16::Path path : paths()) {
    CAPTURE(bf16::name(path));
    std::mt19937 rng(23);
    const long shapes[][3] = {{1, 1, 1}, {33, 64, 288}, {97, 31, 385}, {588, 64, 288}, {40, 530, 800}};
    for (const auto& s : shapes) {
      const long rows = s[0], cols = s[1], depth = s[2];
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(depth);
      const long stride = bf16::rounded_stride(depth);
      CHECK(stride % 32 == 0);
      CHECK(stride >= depth);
      CHECK(bf16::rounded_rows(rows) % 32 == 0);
      const auto a = random_matrix(rows * depth, rng), b = random_matrix(depth * cols, rng, 0.1f);
      const auto c0 = random_matrix(rows * cols, rng);
      // The rows past `rows` hold garbage: their sums are never stored.
      std::vector<std::uint16_t> bits(static_cast<std::size_t>(bf16::rounded_rows(rows) * stride), 0x7FC1);
      for (long r = 0; r < rows; ++r) {
        std::uint16_t* row = bits.data() + r * stride;
        bf16::round_bits_into(a.data() + r * depth, static_cast<std::size_t>(depth), row);
        std::fill(row + depth, row + stride, std::uint16_t{0});
      }
      std::vector<unsigned char> pack(bf16::gemm_pack_bytes(rows, cols, depth));
      for (bool accumulate : {false, true}) {
        CAPTURE(accumulate);
        std::vector<float> want = c0, got = c0;
        run(path, rows, cols, depth, a, false, b, false, want, accumulate);
        bf16::gemm(path, rows, cols, depth, bf16::RoundedRows{bits.data(), stride}, {b.data()}, got.data(),
                   accumulate, pack.data(), pack.size());
        CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
      }
    }
    std::vector<std::uint16_t> bits(32 * 64);
    std::vector<float> b(40 * 8), c(32 * 8);
    std::vector<unsigned char> pack(bf16::gemm_pack_bytes(32, 8, 40));
    // A stride below the depth rounded up to 32, or not a multiple of 32, is refused, naming what it needs.
    for (long stride : {32L, 48L}) {
      CAPTURE(stride);
      CHECK_THROWS_WITH_AS(bf16::gemm(path, 32, 8, 40, bf16::RoundedRows{bits.data(), stride}, {b.data()}, c.data(),
                                      false, pack.data(), pack.size()),
                           doctest::Contains("a multiple of 32 and at least 64 for depth 40"), pmap::ValueError);
    }
  }
}

TEST_CASE("bf16 GEMM on a transposed a's depth pairs: the same bits as on the floats they were rounded from") {
  std::mt19937 rng(29);
  // pair_rows_into: two rows rounded and interleaved, any length (the vector loop's tail), the second optional.
  for (long n : {1L, 15L, 16L, 17L, 300L}) {
    CAPTURE(n);
    const auto r0 = random_matrix(n, rng), r1 = random_matrix(n, rng);
    std::vector<std::uint32_t> both(static_cast<std::size_t>(n) + 1, 7u), one(static_cast<std::size_t>(n), 7u);
    bf16::pair_rows_into(r0.data(), r1.data(), static_cast<std::size_t>(n), both.data());
    bf16::pair_rows_into(r0.data(), nullptr, static_cast<std::size_t>(n), one.data());
    for (long i = 0; i < n; ++i) {
      const auto at = static_cast<std::size_t>(i);
      CHECK(both[at] == (std::uint32_t{bf16::round_bits(r0[at])} | std::uint32_t{bf16::round_bits(r1[at])} << 16));
      CHECK(one[at] == bf16::round_bits(r0[at]));
    }
    CHECK(both.back() == 7u);  // nothing written past n
  }
  for (bf16::Path path : paths()) {
    CAPTURE(bf16::name(path));
    // A conv weight gradient's shapes (288 x 64 over a chunk of pixels), odd depths (the last pair's high half
    // zero), depth blocks (384), rows past a block of 96 and strides above the rows.
    const long shapes[][4] = {{1, 1, 1, 1}, {288, 64, 392, 288}, {288, 64, 785, 300}, {97, 31, 385, 97},
                              {33, 530, 70, 48}};
    for (const auto& s : shapes) {
      const long rows = s[0], cols = s[1], depth = s[2], stride = s[3];
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(depth);
      CAPTURE(stride);
      // at: a's transpose (depth, rows), row-major, as a weight gradient's patches are stored
      const auto at = random_matrix(depth * rows, rng), b = random_matrix(depth * cols, rng, 0.1f);
      const auto c0 = random_matrix(rows * cols, rng);
      std::vector<std::uint32_t> pairs(static_cast<std::size_t>((depth + 1) / 2 * stride), 0xFFC1FFC1u);
      for (long p = 0; p < (depth + 1) / 2; ++p)
        bf16::pair_rows_into(at.data() + 2 * p * rows, 2 * p + 1 < depth ? at.data() + (2 * p + 1) * rows : nullptr,
                             static_cast<std::size_t>(rows), pairs.data() + p * stride);
      std::vector<unsigned char> pack(bf16::gemm_pack_bytes(rows, cols, depth));
      for (bool accumulate : {false, true}) {
        CAPTURE(accumulate);
        std::vector<float> want = c0, got = c0;
        bf16::gemm(path, rows, cols, depth, {at.data(), true}, {b.data()}, want.data(), accumulate, pack.data(),
                   pack.size());
        bf16::gemm(path, rows, cols, depth, bf16::PairedTranspose{pairs.data(), stride}, {b.data()}, got.data(),
                   accumulate, pack.data(), pack.size());
        CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
      }
    }
    std::vector<std::uint32_t> pairs(20 * 32);
    std::vector<float> b(40 * 8), c(32 * 8);
    std::vector<unsigned char> pack(bf16::gemm_pack_bytes(32, 8, 40));
    CHECK_THROWS_WITH_AS(bf16::gemm(path, 32, 8, 40, bf16::PairedTranspose{pairs.data(), 31}, {b.data()}, c.data(),
                                    false, pack.data(), pack.size()),
                         doctest::Contains("a stride of at least its 32 rows; got stride 31"), pmap::ValueError);
    CHECK_THROWS_AS(bf16::gemm(path, 32, 8, 40, bf16::PairedTranspose{nullptr, 32}, {b.data()}, c.data(), false,
                               pack.data(), pack.size()),
                    pmap::ValueError);
  }
}

}  // namespace PMAPCC_TEST_FILE
