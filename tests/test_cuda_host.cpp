// The CUDA code where no GPU is needed to check it: the row-major to column-major GEMM mapping against a
// row-major reference (and cuBLAS with a GPU), the bf16 rounding and the bf16 product (likewise), the host
// launcher's grid-stride order, and the runtime's own kernels (src/device_kernels.h: the device hub's
// rank-order reduction, pmean's division, pmax/pmin's order keys over NCCL, the samplers) run over their
// launch grids on the host against the host paths they must equal bit for bit.
#include "cuda_testing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>

#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cuda/exec.h>
#include <pmapcc/kernels/cuda/linear.h>
#include "src/device_kernels.h"
#include "src/reduce.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using namespace cuda_testing;
namespace gpu = pmap::kernels::gpu;
using pmap::detail::Grid;

// C_i = op(A_i) @ op(B_i) + beta * C_i, row-major, each entry summed in double over k in order.
std::vector<float> reference_gemm(const gpu::Gemm& g, const std::vector<float>& a, const std::vector<float>& b,
                                  std::vector<float> c) {
  for (int i = 0; i < g.batch; ++i) {
    const float* ai = a.data() + i * g.stride_a;
    const float* bi = b.data() + i * g.stride_b;
    float* ci = c.data() + i * g.stride_c;
    for (int r = 0; r < g.m; ++r)
      for (int col = 0; col < g.n; ++col) {
        double acc = 0;
        for (int l = 0; l < g.k; ++l) {
          const double x = g.trans_a ? ai[l * g.m + r] : ai[r * g.k + l];
          const double y = g.trans_b ? bi[col * g.k + l] : bi[l * g.n + col];
          acc += x * y;
        }
        float& out = ci[r * g.n + col];
        out = static_cast<float>(g.beta == 0.0f ? acc : acc + static_cast<double>(g.beta) * out);
      }
  }
  return c;
}

template <class T> bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("cuda host run: the GEMM's column-major mapping equals row-major products (and cuBLAS with a GPU)") {
  const bool with_gpu = gpu_usable();
  int cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool shared_a : {false, true})
        for (float beta : {0.0f, 1.0f}) {
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(shared_a);
          CAPTURE(beta);
          gpu::Gemm g;
          g.trans_a = ta, g.trans_b = tb, g.m = 5, g.n = 4, g.k = 3, g.batch = 3, g.beta = beta;
          g.stride_a = shared_a ? 0 : g.m * g.k, g.stride_b = g.k * g.n, g.stride_c = g.m * g.n;
          const auto a = random_floats(static_cast<std::size_t>(3 * g.m * g.k), 1);
          const auto b = random_floats(static_cast<std::size_t>(3 * g.k * g.n), 2);
          auto c = random_floats(static_cast<std::size_t>(3 * g.m * g.n), 3);
          if (beta == 0.0f) c[0] = std::numeric_limits<float>::quiet_NaN();  // beta 0: C is not read
          const auto expect = reference_gemm(g, a, b, c);
          std::vector<float> host = c;
          gpu::Exec::host().gemm(g, a.data(), b.data(), host.data());
          CHECK(same_bytes(host, expect));
          if (with_gpu) {
            auto ga = on_gpu(a), gb = on_gpu(b), gc = on_gpu(c);
            gpu::Exec::gpu().gemm(g, ga.data<float>(), gb.data<float>(), gc.data<float>());
            CHECK(relative_error(gc.to_vector<float>(), expect) <= kForwardTolerance);
          }
          ++cases;
        }
  CHECK(cases == 16);
  // The mapping itself: operands swapped, transposes kept, leading dimensions of the row-major storage.
  gpu::Gemm g;
  g.trans_a = true, g.m = 7, g.n = 2, g.k = 5, g.stride_a = 35, g.stride_b = 10, g.stride_c = 14, g.batch = 4;
  float a = 0, b = 0, c = 0;
  const gpu::ColumnMajorGemm cm = gpu::column_major(g, &a, &b, &c);
  CHECK(cm.a == &b);
  CHECK(cm.b == &a);
  CHECK(cm.c == &c);
  CHECK((cm.m == 2 && cm.n == 7 && cm.k == 5));
  CHECK((!cm.trans_a && cm.trans_b));
  CHECK((cm.lda == 2 && cm.ldb == 7 && cm.ldc == 2));
  CHECK((cm.stride_a == 10 && cm.stride_b == 35 && cm.stride_c == 14 && cm.batch == 4));
}

namespace {

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
std::uint32_t to_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = gpu::bf16_widen(gpu::bf16_bits(x));
  return v;
}

// The bf16 space of g on `device`: bf16_operand_bytes(g) from an odd address (odd() below), so that
// product()'s own alignment is what is tested.
pmap::Array bf16_space(const gpu::Gemm& g, const pmap::Device& device) {
  return zeros(device, gpu::bf16_operand_bytes(g) + 3, pmap::DType::u8);
}
void* odd(pmap::Array& space) { return static_cast<unsigned char*>(space.raw_data()) + 3; }

}  // namespace

TEST_CASE("cuda bf16: operands rounded as the GPU rounds them (nearest even, subnormals kept, NaN quiet)") {
  struct Case {
    std::uint32_t in;
    std::uint16_t out;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80},  // 1
      {0x3f808000u, 0x3f80},  // 1 + 2^-8: a tie, to the even neighbour below
      {0x3f818000u, 0x3f82},  // a tie whose lower neighbour is odd: up
      {0x3f808001u, 0x3f81},  // just above the tie
      {0xbf80ffffu, 0xbf81},  // negative, rounds away in magnitude
      {0x7f7fffffu, 0x7f80},  // the largest float overflows to infinity
      {0xff800000u, 0xff80},  // -infinity stays
      {0x80000000u, 0x8000},  // -0
      {0x00010000u, 0x0001},  // the smallest bf16 subnormal: kept (the CPU's vcvtneps2bf16 gives 0)
      {0x00018000u, 0x0002},  // a subnormal tie, to even
      {0x00008000u, 0x0000},  // a subnormal tie to zero
      {0x007fffffu, 0x0080},  // the largest float subnormal rounds up to the smallest normal
      {0x7fc00001u, 0x7fc0},  // a quiet NaN keeps its payload's top bits
      {0x7f800001u, 0x7fc0},  // a signalling NaN whose payload would round away is quieted, not infinity
      {0xff800001u, 0xffc0},  // with its sign
  };
  for (const Case& c : cases) {
    CAPTURE(c.in);
    CHECK(gpu::bf16_bits(from_bits(c.in)) == c.out);
    CHECK(to_bits(gpu::bf16_widen(c.out)) == static_cast<std::uint32_t>(c.out) << 16);
  }
  // On normal numbers, exactly the CPU's rounding (kernels/cpu/shared/bf16_gemm.h).
  std::mt19937 gen(11);
  std::uniform_int_distribution<std::uint32_t> bits(0x00800000u, 0x7f7fffffu);
  int checked = 0;
  for (int i = 0; i < 100000; ++i) {
    const float x = from_bits(bits(gen) | (i % 2 == 0 ? 0u : 0x80000000u));
    if (gpu::bf16_bits(x) != pmap::kernels::bf16::round_bits(x)) {
      FAIL_CHECK("bf16 rounding differs from the CPU's on " << x);
      break;
    }
    ++checked;
  }
  CHECK(checked == 100000);
}

TEST_CASE("cuda bf16 GEMM: the product of the bf16-rounded operands, summed in fp32 (bitwise on the host)") {
  const bool with_gpu = gpu_usable();
  // x @ [1]: the rounded operand itself, bit for bit on the host and on the GPU (a product of two bf16
  // values is exact in fp32, and there is one).
  {
    std::vector<float> a;
    for (std::uint32_t u : {0x3f808000u, 0x3f818000u, 0x3f808001u, 0xbf80ffffu, 0x7f7fffffu, 0xff7fffffu,
                            0x40490fdbu, 0xc2f6e979u, 0x3dcccccdu})
      a.push_back(from_bits(u));
    gpu::Gemm g;
    g.m = static_cast<int>(a.size()), g.n = 1, g.k = 1, g.bf16 = true;
    const std::vector<float> one{1.0f};
    std::vector<float> c(a.size(), -7.0f);
    auto space = bf16_space(g, pmap::Device{});
    gpu::product(gpu::Exec::host(), g, a.data(), one.data(), c.data(), odd(space));
    CHECK(same_bytes(c, bf16_rounded(a)));
    if (with_gpu) {
      auto ga = on_gpu(a), gb = on_gpu(one), gc = gpu_floats(a.size()), gspace = bf16_space(g, kGpu);
      gpu::product(gpu::Exec::gpu(), g, ga.data<float>(), gb.data<float>(), gc.data<float>(), odd(gspace));
      CHECK(same_bytes(gc.to_vector<float>(), bf16_rounded(a)));
    }
  }
  int cases = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool shared_a : {false, true}) {
        CAPTURE(ta);
        CAPTURE(tb);
        CAPTURE(shared_a);
        gpu::Gemm g;
        g.trans_a = ta, g.trans_b = tb, g.m = 33, g.n = 20, g.k = 300, g.batch = 3, g.beta = shared_a ? 1.0f : 0.0f;
        g.stride_a = shared_a ? 0 : g.m * g.k, g.stride_b = g.k * g.n, g.stride_c = g.m * g.n, g.bf16 = true;
        const auto a = random_floats(static_cast<std::size_t>(3 * g.m * g.k), 21);
        const auto b = random_floats(static_cast<std::size_t>(3 * g.k * g.n), 22);
        const auto c = random_floats(static_cast<std::size_t>(3 * g.m * g.n), 23);
        const auto expect = reference_gemm(g, bf16_rounded(a), bf16_rounded(b), c);
        std::vector<float> host = c;
        auto space = bf16_space(g, pmap::Device{});
        gpu::product(gpu::Exec::host(), g, a.data(), b.data(), host.data(), odd(space));
        CHECK(same_bytes(host, expect));
        // Not the fp32 product: the rounding is there (k = 300 terms of relative error up to 2^-8 each).
        CHECK(relative_error(host, reference_gemm(g, a, b, c)) > 1e-4);
        if (with_gpu) {
          auto ga = on_gpu(a), gb = on_gpu(b), gc = on_gpu(c), gspace = bf16_space(g, kGpu);
          gpu::product(gpu::Exec::gpu(), g, ga.data<float>(), gb.data<float>(), gc.data<float>(), odd(gspace));
          CHECK(relative_error(gc.to_vector<float>(), expect) <= kForwardTolerance);
        }
        ++cases;
      }
  CHECK(cases == 8);
  gpu::Gemm g;
  g.m = g.n = g.k = 2, g.bf16 = true;
  CHECK(gpu::bf16_operand_bytes(g) >= 2 * 4 * sizeof(std::uint16_t));
  g.bf16 = false;
  CHECK(gpu::bf16_operand_bytes(g) == 0);
  g.bf16 = true;
  std::vector<float> m4(4, 1.0f), out(4);
  CHECK_THROWS_WITH_AS(gpu::product(gpu::Exec::host(), g, m4.data(), m4.data(), out.data(), nullptr),
                       doctest::Contains("bf16_operand_bytes"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(gpu::Exec::host().gemm(g, m4.data(), m4.data(), out.data()),
                       doctest::Contains("takes bf16 operands"), pmap::ValueError);
  const std::vector<std::uint16_t> b4(4, 0x3f80);
  g.bf16 = false;
  CHECK_THROWS_WITH_AS(gpu::Exec::host().gemm(g, b4.data(), b4.data(), out.data()),
                       doctest::Contains("bf16 set"), pmap::ValueError);
}

TEST_CASE("cuda host run: the host launcher visits every item once, in the GPU's thread-to-item order") {
  for (std::size_t items : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
    for (Grid grid : {Grid{1, 1}, Grid{2, 3}, pmap::detail::grid_for(items)}) {
      std::vector<std::size_t> visits;
      pmap::detail::host_launch([&](std::size_t i) { visits.push_back(i); }, items, grid);
      REQUIRE(visits.size() == items);
      // Thread t handles t, t + stride, ...: items in order within a thread, threads in order.
      const std::size_t stride = static_cast<std::size_t>(grid.blocks) * grid.threads;
      std::vector<std::size_t> expect;
      for (std::size_t t = 0; t < stride; ++t)
        for (std::size_t i = t; i < items; i += stride) expect.push_back(i);
      CHECK(visits == expect);
    }
  }
  CHECK(pmap::detail::grid_for(100'000'000).blocks == pmap::detail::kLaunchMaxBlocks);
  CHECK(pmap::detail::grid_for(300).blocks == 2);
}

namespace {

// The device hub's reduction of n ranks' buffers, run on the host, against the host hub's reduce_range.
template <class T> void check_reduce_ranks(int n, pmap::ReduceOp op, Grid grid_override) {
  CAPTURE(n);
  CAPTURE(static_cast<int>(op));
  const std::size_t len = 37, src_off = 5, dst_off = 3, total = 50;
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n), std::vector<T>(total));
  std::mt19937 gen(static_cast<unsigned>(n * 7 + static_cast<int>(op)));
  for (auto& v : in)
    for (auto& x : v) x = static_cast<T>(gen() % 200) - static_cast<T>(std::is_signed_v<T> ? 100 : 0);
  if constexpr (std::is_floating_point_v<T>) in[0][src_off + 4] = std::numeric_limits<T>::quiet_NaN();
  std::vector<std::vector<T>> expect(2, std::vector<T>(total, T{1})), got = expect, got_small = expect;
  std::vector<const void*> sends;
  for (auto& v : in) sends.push_back(v.data());
  pmap::detail::reduce_range<T>(sends, {expect[0].data(), expect[1].data()}, src_off, dst_off, len, op);
  pmap::detail::RankPointers p{};
  p.n = n;
  for (int r = 0; r < n; ++r) p.in[r] = in[static_cast<std::size_t>(r)].data();
  for (auto* out : {&got, &got_small}) {
    p.out[0] = (*out)[0].data(), p.out[1] = (*out)[1].data();
    const pmap::detail::ReduceRanks<T> kernel{p, 2, src_off, dst_off, op};
    pmap::detail::host_launch(kernel, len, out == &got ? pmap::detail::hub_grid(len) : grid_override);
  }
  for (int k = 0; k < 2; ++k) {
    CHECK(same_bytes(got[static_cast<std::size_t>(k)], expect[static_cast<std::size_t>(k)]));
    CHECK(same_bytes(got_small[static_cast<std::size_t>(k)], expect[static_cast<std::size_t>(k)]));
  }
}

}  // namespace

TEST_CASE("cuda host run: the device hub reduces in rank order, bitwise the host hub, NaN included") {
  for (int n : {1, 2, 3, 5})
    for (pmap::ReduceOp op : {pmap::ReduceOp::sum, pmap::ReduceOp::max, pmap::ReduceOp::min}) {
      check_reduce_ranks<float>(n, op, Grid{2, 3});
      check_reduce_ranks<double>(n, op, Grid{1, 4});
      check_reduce_ranks<std::int32_t>(n, op, Grid{3, 2});
      check_reduce_ranks<std::uint8_t>(n, op, Grid{1, 1});
    }
  std::vector<float> x = random_floats(1001, 5), expect = x;
  for (float& v : expect) v /= 3.0f;
  pmap::detail::host_launch(pmap::detail::DivideBy<float>{x.data(), 3.0f}, x.size(), pmap::detail::hub_grid(x.size()));
  CHECK(same_bytes(x, expect));
}

namespace {

// pmax/pmin over NCCL (review F2): n ranks' floats to order keys (the kernel, on the host), reduced as
// integers as NCCL's ncclMax/ncclMin do, and back; against the host hub's NaN-propagating combine.
template <class F, class I> void check_order_keys(int n, pmap::ReduceOp op) {
  CAPTURE(n);
  CAPTURE(static_cast<int>(op));
  const F nan = std::numeric_limits<F>::quiet_NaN(), inf = std::numeric_limits<F>::infinity();
  const F specials[] = {nan, -nan, inf, -inf, F(0), -F(0), std::numeric_limits<F>::denorm_min(),
                        -std::numeric_limits<F>::denorm_min(), std::numeric_limits<F>::max(),
                        std::numeric_limits<F>::lowest()};
  const std::size_t len = 300;
  std::mt19937 gen(static_cast<unsigned>(n * 13 + static_cast<int>(op)));
  std::vector<std::vector<F>> ranks(static_cast<std::size_t>(n), std::vector<F>(len));
  for (auto& v : ranks)
    for (auto& x : v)
      x = gen() % 4 == 0 ? specials[gen() % std::size(specials)] : static_cast<F>(static_cast<int>(gen() % 2001) - 1000) / F(7);
  const bool max = op == pmap::ReduceOp::max;
  std::vector<I> reduced(len);
  for (int r = 0; r < n; ++r) {
    std::vector<F> buffer = ranks[static_cast<std::size_t>(r)];  // in place, as the communicator runs it
    pmap::detail::host_launch(pmap::detail::ToOrderKeys<F, I>{buffer.data(), buffer.data(), max}, len,
                              pmap::detail::hub_grid(len));
    std::vector<I> keys(len);
    std::memcpy(keys.data(), buffer.data(), len * sizeof(I));
    for (std::size_t i = 0; i < len; ++i)
      reduced[i] = r == 0 ? keys[i] : max ? std::max(reduced[i], keys[i]) : std::min(reduced[i], keys[i]);
  }
  std::vector<F> got(len);
  std::memcpy(got.data(), reduced.data(), len * sizeof(F));
  pmap::detail::host_launch(pmap::detail::FromOrderKeys<F, I>{got.data()}, len, Grid{2, 3});
  for (std::size_t i = 0; i < len; ++i) {
    F want = ranks[0][i];
    for (int r = 1; r < n; ++r) want = pmap::detail::combine_ranks(want, ranks[static_cast<std::size_t>(r)][i], op);
    CAPTURE(i);
    if (std::isnan(want)) {
      CHECK(std::isnan(got[i]));
    } else if (want == F(0)) {  // the keys order -0 below +0; the hub keeps whichever came first
      bool neg = false, pos = false;
      for (const auto& v : ranks) {
        neg = neg || (v[i] == F(0) && std::signbit(v[i]));
        pos = pos || (v[i] == F(0) && !std::signbit(v[i]));
      }
      CHECK(got[i] == F(0));
      CHECK(std::signbit(got[i]) == (max ? !pos : neg));
    } else {
      CHECK(got[i] == want);
    }
  }
  // NaN first, last and alone; the values come back bit for bit through a lone rank.
  if (n == 1) {
    std::vector<F> same(ranks[0]);
    pmap::detail::host_launch(pmap::detail::ToOrderKeys<F, I>{same.data(), same.data(), max}, len,
                              pmap::detail::hub_grid(len));
    pmap::detail::host_launch(pmap::detail::FromOrderKeys<F, I>{same.data()}, len, pmap::detail::hub_grid(len));
    for (std::size_t i = 0; i < len; ++i)
      if (!std::isnan(ranks[0][i])) CHECK(std::memcmp(&same[i], &ranks[0][i], sizeof(F)) == 0);
  }
}

}  // namespace

TEST_CASE("cuda host run: pmax/pmin over NCCL reduce order keys, NaN winning, as the hubs do (review F2)") {
  for (int n : {1, 2, 3, 8})
    for (pmap::ReduceOp op : {pmap::ReduceOp::max, pmap::ReduceOp::min}) {
      check_order_keys<float, std::int32_t>(n, op);
      check_order_keys<double, std::int64_t>(n, op);
    }
  // The ends of the key range are NaN's: +inf and -inf are not.
  CHECK(pmap::detail::order_key<float, std::int32_t>(std::numeric_limits<float>::infinity(), true) <
        pmap::detail::order_key<float, std::int32_t>(std::numeric_limits<float>::quiet_NaN(), true));
  CHECK(pmap::detail::order_key<float, std::int32_t>(-std::numeric_limits<float>::infinity(), false) >
        pmap::detail::order_key<float, std::int32_t>(std::numeric_limits<float>::quiet_NaN(), false));
  CHECK(std::isnan(pmap::detail::order_key_value<double, std::int64_t>(std::numeric_limits<std::int64_t>::min())));
}

TEST_CASE("cuda host run: the sampler kernel draws the host samplers' numbers bit for bit") {
  using pmap::detail::SampleKind;
  for (std::size_t count : {std::size_t{1}, std::size_t{6}, std::size_t{4099}}) {
    for (Grid grid : {pmap::detail::sample_grid(count), Grid{2, 3}}) {
      CAPTURE(count);
      CAPTURE(grid.blocks);
      const pmap::Key key = pmap::key(11);
      auto draw = [&](SampleKind kind, float a, float b, void* out) {
        pmap::detail::SampleRequest r;
        r.kind = kind, r.key = key, r.a = a, r.b = b, r.out = out, r.count = count;
        pmap::detail::host_launch(pmap::detail::SampleBlocks{pmap::detail::sample_params(r)},
                                  pmap::detail::sample_items(count), grid);
      };
      std::vector<std::uint32_t> bits(count), bits_k(count);
      pmap::random_bits(key, bits);
      draw(SampleKind::bits, 0, 0, bits_k.data());
      CHECK(bits_k == bits);
      std::vector<float> f(count), f_k(count);
      pmap::uniform(key, f, -0.5f, 3.0f);
      draw(SampleKind::uniform, -0.5f, 3.0f, f_k.data());
      CHECK(same_bytes(f_k, f));
      pmap::normal(key, f, 0.3f, 1.7f);
      draw(SampleKind::normal, 0.3f, 1.7f, f_k.data());
      CHECK(same_bytes(f_k, f));  // the same logf / sinf / cosf on the host
      pmap::truncated_normal(key, f, -2.0f, 2.0f);
      draw(SampleKind::truncated_normal, -2.0f, 2.0f, f_k.data());
      CHECK(same_bytes(f_k, f));
      std::vector<std::uint8_t> coin(count), coin_k(count);
      pmap::bernoulli(key, coin, 0.3f);
      draw(SampleKind::bernoulli, 0.3f, 0, coin_k.data());
      CHECK(coin_k == coin);
    }
  }
}

}  // namespace PMAPCC_TEST_FILE
