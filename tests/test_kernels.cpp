// Tests of the CPU conv2d and avg_pool ops: forward against naive loops, every backward against central
// finite differences, batched members against single-member calls (bitwise), workspace handling.
#include <doctest/doctest.h>
#include <pmap/error.h>

#include <cstdint>
#include <vector>

#include "kernel_checks.h"
#include <pmapcc/kernels/cpu_backend.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace kc = kernel_checks;
namespace {
const pmap::kernels::CpuBackend& cpu_ops() { return pmap::kernels::cpu_backend(); }
}  // namespace
using pmap::kernels::AvgPoolParams;
using pmap::kernels::Conv2dParams;
using pmap::kernels::Padding;

namespace {

Conv2dParams conv_params(int members, int batch, int h, int w, int cin, int cout) {
  Conv2dParams p;
  p.members = members;
  p.batch = batch;
  p.height = h;
  p.width = w;
  p.in_channels = cin;
  p.out_channels = cout;
  return p;
}

// Element counts of a conv's tensors.
struct ConvSizes {
  std::size_t x, w, b, y;
  explicit ConvSizes(const Conv2dParams& p) {
    const auto g = pmap::kernels::conv2d_geometry(p);
    const std::size_t m = p.members, n = p.batch;
    x = (p.shared_input ? 1 : m) * n * p.height * p.width * p.in_channels;
    w = m * p.kernel_h * p.kernel_w * p.in_channels * p.out_channels;
    b = m * p.out_channels;
    y = m * n * g.out_height * g.out_width * p.out_channels;
  }
};

// y = conv(x, w) + b by the definition, in double.
std::vector<double> conv_reference(const Conv2dParams& p, const std::vector<float>& x,
                                   const std::vector<float>& w, const std::vector<float>& b) {
  const auto g = pmap::kernels::conv2d_geometry(p);
  const int kh = p.kernel_h, kw = p.kernel_w, ci = p.in_channels, co = p.out_channels;
  std::vector<double> y;
  for (int m = 0; m < p.members; ++m) {
    const std::size_t x0 = p.shared_input ? 0 : std::size_t(m) * p.batch * p.height * p.width * ci;
    for (int n = 0; n < p.batch; ++n)
      for (int oy = 0; oy < g.out_height; ++oy)
        for (int ox = 0; ox < g.out_width; ++ox)
          for (int o = 0; o < co; ++o) {
            double s = b[m * co + o];
            for (int ky = 0; ky < kh; ++ky)
              for (int kx = 0; kx < kw; ++kx)
                for (int c = 0; c < ci; ++c) {
                  const int iy = oy * p.stride_h - g.pad_top + ky, ix = ox * p.stride_w - g.pad_left + kx;
                  if (iy < 0 || iy >= p.height || ix < 0 || ix >= p.width) continue;
                  s += double(x[x0 + ((std::size_t(n) * p.height + iy) * p.width + ix) * ci + c]) *
                       w[((std::size_t(m * kh + ky) * kw + kx) * ci + c) * co + o];
                }
            y.push_back(s);
          }
  }
  return y;
}

// Forward against the reference; dx, dw, db against finite differences of sum(r * y).
void check_conv(const Conv2dParams& p) {
  const ConvSizes size(p);
  std::vector<float> x = kc::random_floats(size.x, 1), w = kc::random_floats(size.w, 2);
  std::vector<float> b = kc::random_floats(size.b, 3), r = kc::random_floats(size.y, 4);
  std::vector<float> y(size.y);
  std::vector<unsigned char> ws(cpu_ops().conv().conv2d_workspace_bytes(p));
  cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data());
  CHECK(kc::max_rel_diff(y, conv_reference(p, x, w, b)) < 1e-6);

  std::vector<float> dx(size.x), dw(size.w), db(size.b);
  cpu_ops().conv().conv2d_backward(p, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), ws.data());
  const auto objective = [&] {
    cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data());
    return kc::weighted_sum(y, r);
  };
  kc::check_grad("conv2d dx", dx, kc::numeric_grad(x, objective, 0.1f));
  kc::check_grad("conv2d dw", dw, kc::numeric_grad(w, objective, 0.1f));
  kc::check_grad("conv2d db", db, kc::numeric_grad(b, objective, 0.1f));
}

}  // namespace

TEST_CASE("conv2d geometry follows XLA/Flax SAME and VALID") {
  auto p = conv_params(1, 1, 28, 28, 1, 32);
  auto g = pmap::kernels::conv2d_geometry(p);  // 3x3 SAME stride 1: pad 1 each side
  CHECK(g.out_height == 28);
  CHECK(g.out_width == 28);
  CHECK(g.pad_top == 1);
  CHECK(g.pad_left == 1);
  p.height = 7;
  p.width = 6;
  p.stride_h = p.stride_w = 2;  // SAME stride 2: out = ceil(in/2); pads 2 -> (1, 1) and 1 -> (0, 1)
  g = pmap::kernels::conv2d_geometry(p);
  CHECK(g.out_height == 4);
  CHECK(g.out_width == 3);
  CHECK(g.pad_top == 1);
  CHECK(g.pad_left == 0);
  p.padding = Padding::valid;  // (7 - 3) / 2 + 1 = 3, (6 - 3) / 2 + 1 = 2
  g = pmap::kernels::conv2d_geometry(p);
  CHECK(g.out_height == 3);
  CHECK(g.out_width == 2);
  p.padding = Padding::explicit_pads;
  p.pad_top = 2;
  p.pad_bottom = 0;
  p.pad_left = 1;
  p.pad_right = 1;  // (7 + 2 - 3) / 2 + 1 = 4, (6 + 2 - 3) / 2 + 1 = 3
  g = pmap::kernels::conv2d_geometry(p);
  CHECK(g.out_height == 4);
  CHECK(g.out_width == 3);
  CHECK(g.pad_top == 2);
  CHECK(g.pad_left == 1);
}

TEST_CASE("conv2d forward matches the definition and backward matches finite differences") {
  SUBCASE("3x3 SAME stride 1, three members") { check_conv(conv_params(3, 2, 5, 4, 3, 4)); }
  SUBCASE("3x3 SAME stride 2, uneven padding") {
    auto p = conv_params(2, 2, 7, 6, 2, 3);
    p.stride_h = p.stride_w = 2;
    check_conv(p);
  }
  SUBCASE("2x3 VALID, stride (1, 2)") {
    auto p = conv_params(2, 1, 6, 7, 2, 3);
    p.kernel_h = 2;
    p.padding = Padding::valid;
    p.stride_w = 2;
    check_conv(p);
  }
  SUBCASE("5x5 explicit padding") {
    auto p = conv_params(1, 2, 6, 5, 2, 2);
    p.kernel_h = p.kernel_w = 5;
    p.padding = Padding::explicit_pads;
    p.pad_top = 2;
    p.pad_bottom = 1;
    p.pad_left = 0;
    p.pad_right = 3;
    check_conv(p);
  }
  SUBCASE("1x1 (the patch matrix is the input itself)") { check_conv(conv_params(2, 2, 3, 4, 5, 3)); }
  // Patches of at most 16 values take the direct path: output channels in SIMD blocks and a scalar tail.
  SUBCASE("direct: 1 channel 3x3 SAME, 11 outputs, shared input") {
    auto p = conv_params(2, 2, 6, 5, 1, 11);
    p.shared_input = true;
    check_conv(p);
  }
  SUBCASE("direct: 1 channel 3x3 SAME, 29 outputs (16 + 8 + 4 + 1 with AVX-512, 3 x 8 + 4 + 1 with AVX2)") {
    check_conv(conv_params(2, 2, 5, 6, 1, 29));
  }
  SUBCASE("direct: 1 channel 3x3 SAME stride 2, 40 outputs") {
    auto p = conv_params(2, 1, 7, 8, 1, 40);
    p.stride_h = p.stride_w = 2;
    check_conv(p);
  }
  SUBCASE("direct: 1 channel 3x3 VALID stride 2, 8 outputs, shared input") {
    auto p = conv_params(2, 3, 12, 12, 1, 8);
    p.stride_h = p.stride_w = 2;
    p.padding = Padding::valid;
    p.shared_input = true;
    check_conv(p);
  }
  SUBCASE("2x2 SAME (the extra padding after), no bias") {
    auto p = conv_params(2, 2, 5, 5, 8, 12);
    p.kernel_h = p.kernel_w = 2;
    check_conv(p);
  }
  SUBCASE("direct: 4x4 explicit padding, 1 channel, 8 outputs") {
    auto p = conv_params(1, 2, 5, 6, 1, 8);
    p.kernel_h = p.kernel_w = 4;
    p.padding = Padding::explicit_pads;
    p.pad_top = 0;
    p.pad_bottom = 2;
    p.pad_left = 3;
    p.pad_right = 1;
    check_conv(p);
  }
  SUBCASE("shared input: dx sums over members") {
    auto p = conv_params(3, 2, 5, 6, 2, 4);
    p.shared_input = true;
    check_conv(p);
  }
  SUBCASE("shared 1x1 input") {
    auto p = conv_params(3, 2, 4, 3, 3, 2);
    p.kernel_h = p.kernel_w = 1;
    p.shared_input = true;
    check_conv(p);
  }
}

TEST_CASE("conv2d with M members equals M single-member calls bitwise") {
  // Shapes of the MNIST CNN, batches large enough for several im2col chunks, with a ragged last one.
  auto conv1 = conv_params(3, 41, 28, 28, 1, 32);
  conv1.shared_input = true;
  auto conv2 = conv_params(3, 5, 14, 14, 32, 64);
  auto odd = conv_params(3, 3, 9, 7, 3, 6);
  odd.stride_h = 2;
  for (const Conv2dParams& p : {conv1, conv2, odd}) {
    CAPTURE(p.in_channels);
    const ConvSizes all(p);
    Conv2dParams one = p;
    one.members = 1;
    const ConvSizes single(one);
    const auto x = kc::random_floats(all.x, 5), w = kc::random_floats(all.w, 6, 0.3f);
    const auto b = kc::random_floats(all.b, 7), dy = kc::random_floats(all.y, 8);
    std::vector<float> y(all.y), dx(all.x), dw(all.w), db(all.b);
    cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), nullptr);
    cpu_ops().conv().conv2d_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), nullptr);
    std::vector<double> dx_sum(single.x, 0.0);
    for (int m = 0; m < p.members; ++m) {
      const float* xm = x.data() + (p.shared_input ? 0 : m * single.x);
      std::vector<float> y1(single.y), dx1(single.x), dw1(single.w), db1(single.b);
      cpu_ops().conv().conv2d_forward(one, xm, w.data() + m * single.w, b.data() + m * single.b, y1.data(), nullptr);
      cpu_ops().conv().conv2d_backward(one, xm, w.data() + m * single.w, dy.data() + m * single.y, dx1.data(),
                                       dw1.data(), db1.data(), nullptr);
      CHECK(kc::same_bits(y1.data(), y.data() + m * single.y, single.y));
      CHECK(kc::same_bits(dw1.data(), dw.data() + m * single.w, single.w));
      CHECK(kc::same_bits(db1.data(), db.data() + m * single.b, single.b));
      if (!p.shared_input) CHECK(kc::same_bits(dx1.data(), dx.data() + m * single.x, single.x));
      for (std::size_t i = 0; i < single.x; ++i) dx_sum[i] += dx1[i];
    }
    // Shared input: dx is the members' sum, added in another order than summing the single results.
    if (p.shared_input) CHECK(kc::max_rel_diff(dx, dx_sum) < 1e-6);
  }
}

TEST_CASE("conv2d workspace: any alignment, garbage contents, or none") {
  auto p = conv_params(2, 3, 6, 5, 4, 8);
  const ConvSizes size(p);
  const auto x = kc::random_floats(size.x, 9), w = kc::random_floats(size.w, 10);
  const auto b = kc::random_floats(size.b, 11), dy = kc::random_floats(size.y, 12);
  std::vector<float> y_own(size.y), y(size.y), dx_own(size.x), dx(size.x), dw_own(size.w), dw(size.w);
  cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), y_own.data(), nullptr);
  cpu_ops().conv().conv2d_backward(p, x.data(), w.data(), dy.data(), dx_own.data(), dw_own.data(), nullptr, nullptr);
  const std::size_t bytes = cpu_ops().conv().conv2d_workspace_bytes(p);
  std::vector<unsigned char> ws(bytes + 3, 0xff);  // 0xff bytes are NaNs as floats
  void* odd_start = ws.data() + 3;
  cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), odd_start);
  cpu_ops().conv().conv2d_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, odd_start);
  CHECK(kc::same_bits(y.data(), y_own.data(), size.y));
  CHECK(kc::same_bits(dx.data(), dx_own.data(), size.x));
  CHECK(kc::same_bits(dw.data(), dw_own.data(), size.w));
  // Skipping dx (as for a first layer) leaves dw unchanged.
  std::vector<float> dw_only(size.w);
  cpu_ops().conv().conv2d_backward(p, x.data(), w.data(), dy.data(), nullptr, dw_only.data(), nullptr, odd_start);
  CHECK(kc::same_bits(dw_only.data(), dw_own.data(), size.w));
}

TEST_CASE("conv2d rejects bad parameters and missing buffers") {
  auto p = conv_params(1, 1, 4, 4, 1, 1);
  std::vector<float> x(16), w(9), y(16);
  p.batch = 0;
  CHECK_THROWS_AS(cpu_ops().conv().conv2d_forward(p, x.data(), w.data(), nullptr, y.data(), nullptr), pmap::ValueError);
  p.batch = 1;
  p.kernel_h = 5;
  p.padding = Padding::valid;
  CHECK_THROWS_AS(cpu_ops().conv().conv2d_workspace_bytes(p), pmap::ValueError);
  p.kernel_h = 3;
  CHECK_THROWS_AS(cpu_ops().conv().conv2d_forward(p, nullptr, w.data(), nullptr, y.data(), nullptr), pmap::ValueError);
  CHECK_THROWS_AS(cpu_ops().conv().conv2d_backward(p, nullptr, w.data(), y.data(), nullptr, w.data(), nullptr, nullptr),
                  pmap::ValueError);
}

// ---- avg_pool -------------------------------------------------------------------------------------------

namespace {

AvgPoolParams pool_params(int members, int batch, int h, int w, int c, int window, int stride) {
  AvgPoolParams p;
  p.members = members;
  p.batch = batch;
  p.height = h;
  p.width = w;
  p.channels = c;
  p.window_h = p.window_w = window;
  p.stride_h = p.stride_w = stride;
  return p;
}

std::vector<double> pool_reference(const AvgPoolParams& p, const std::vector<float>& x) {
  const int oh = (p.height - p.window_h) / p.stride_h + 1, ow = (p.width - p.window_w) / p.stride_w + 1;
  std::vector<double> y;
  for (int n = 0; n < p.members * p.batch; ++n)
    for (int oy = 0; oy < oh; ++oy)
      for (int ox = 0; ox < ow; ++ox)
        for (int c = 0; c < p.channels; ++c) {
          double s = 0.0;
          for (int ky = 0; ky < p.window_h; ++ky)
            for (int kx = 0; kx < p.window_w; ++kx) {
              const int iy = oy * p.stride_h + ky, ix = ox * p.stride_w + kx;
              s += x[((std::size_t(n) * p.height + iy) * p.width + ix) * p.channels + c];
            }
          y.push_back(s / (p.window_h * p.window_w));
        }
  return y;
}

}  // namespace

TEST_CASE("avg_pool forward matches the definition and backward matches finite differences") {
  for (const AvgPoolParams& p : {pool_params(2, 2, 4, 6, 3, 2, 2), pool_params(3, 1, 5, 7, 2, 2, 2),
                                 pool_params(1, 2, 7, 6, 2, 3, 2), pool_params(2, 1, 8, 7, 2, 2, 3)}) {
    CAPTURE(p.height);
    CAPTURE(p.stride_h);
    const auto g = pmap::kernels::avg_pool_geometry(p);
    const std::size_t xs = std::size_t(p.members) * p.batch * p.height * p.width * p.channels;
    const std::size_t ys = std::size_t(p.members) * p.batch * g.out_height * g.out_width * p.channels;
    std::vector<float> x = kc::random_floats(xs, 13), r = kc::random_floats(ys, 14), y(ys);
    std::vector<float> dx(xs, 123.0f);  // stale contents must be overwritten
    cpu_ops().conv().avg_pool_forward(p, x.data(), y.data());
    CHECK(kc::max_rel_diff(y, pool_reference(p, x)) < 1e-6);
    cpu_ops().conv().avg_pool_backward(p, r.data(), dx.data());
    const auto objective = [&] {
      cpu_ops().conv().avg_pool_forward(p, x.data(), y.data());
      return kc::weighted_sum(y, r);
    };
    kc::check_grad("avg_pool dx", dx, kc::numeric_grad(x, objective, 0.1f));
  }
}

TEST_CASE("avg_pool with M members equals M single-member calls bitwise") {
  const AvgPoolParams p = pool_params(3, 2, 6, 6, 4, 2, 2), one = pool_params(1, 2, 6, 6, 4, 2, 2);
  const std::size_t xs = 2 * 36 * 4, ys = 2 * 9 * 4;
  const auto x = kc::random_floats(3 * xs, 15), dy = kc::random_floats(3 * ys, 16);
  std::vector<float> y(3 * ys), dx(3 * xs), y1(ys), dx1(xs);
  cpu_ops().conv().avg_pool_forward(p, x.data(), y.data());
  cpu_ops().conv().avg_pool_backward(p, dy.data(), dx.data());
  for (int m = 0; m < 3; ++m) {
    cpu_ops().conv().avg_pool_forward(one, x.data() + m * xs, y1.data());
    cpu_ops().conv().avg_pool_backward(one, dy.data() + m * ys, dx1.data());
    CHECK(kc::same_bits(y1.data(), y.data() + m * ys, ys));
    CHECK(kc::same_bits(dx1.data(), dx.data() + m * xs, xs));
  }
}

TEST_CASE("avg_pool rejects a window larger than the input") {
  std::vector<float> x(9), y(9);
  CHECK_THROWS_AS(cpu_ops().conv().avg_pool_forward(pool_params(1, 1, 1, 3, 3, 2, 2), x.data(), y.data()),
                  pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
