// pmap::grad and pmap::value_and_grad (pmapcc/core/grad.h) over pmap::ops (pmapcc/core/ops.h): every
// primitive's VJP against central differences of the same f32 function, on the CPU ops and on the CUDA
// kernels run on the host; argnums, auxiliary results, trees, accumulation, determinism; every error.
#include "cuda_testing.h"
#include "grad_checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/trace.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cpu/shared/bf16_gemm.h>
#include <pmapcc/kernels/cpu_backend.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::random_floats;
using cuda_testing::random_labels;
using pmap::Array;
using pmap::Shape;
namespace ops = pmap::ops;

using grad_checks::arrays;
using grad_checks::Case;
using grad_checks::check_against_differences;
using grad_checks::host;
using grad_checks::inputs_of;
using grad_checks::weighted;

std::vector<Case> cases() {
  using V = const std::vector<Array>&;
  std::vector<Case> out{
      {"add", {{3, 4}, {3, 4}}, [](V x) { return weighted(ops::add(x[0], x[1])); }},
      {"add (b trailing)", {{2, 3, 4}, {4}}, [](V x) { return weighted(ops::add(x[0], x[1])); }},
      {"subtract (b scalar)", {{3, 4}, {}}, [](V x) { return weighted(ops::subtract(x[0], x[1])); }},
      {"multiply (b trailing)", {{3, 4}, {4}}, [](V x) { return weighted(ops::multiply(x[0], x[1])); }},
      {"divide", {{3, 4}, {3, 4}}, [](V x) { return weighted(ops::divide(x[0], x[1])); }, 0.5f, 2.0f},
      {"divide (b scalar)", {{5}, {1}}, [](V x) { return weighted(ops::divide(x[0], x[1])); }, 0.5f, 2.0f},
      {"maximum", {{3, 4}, {3, 4}}, [](V x) { return weighted(ops::maximum(x[0], x[1])); }, -1, 1, true},
      {"minimum (b trailing)", {{3, 4}, {4}}, [](V x) { return weighted(ops::minimum(x[0], x[1])); }, -1, 1, true},
      {"scale", {{6}}, [](V x) { return weighted(ops::scale(x[0], -1.5f, 0.25f)); }},
      {"negative", {{6}}, [](V x) { return weighted(ops::negative(x[0])); }},
      {"abs", {{6}}, [](V x) { return weighted(ops::abs(x[0])); }, -1, 1, true},
      {"square", {{6}}, [](V x) { return weighted(ops::square(x[0])); }},
      {"sqrt", {{6}}, [](V x) { return weighted(ops::sqrt(x[0])); }, 0.5f, 2.0f},
      {"exp", {{6}}, [](V x) { return weighted(ops::exp(x[0])); }},
      {"log", {{6}}, [](V x) { return weighted(ops::log(x[0])); }, 0.5f, 2.0f},
      {"relu", {{8}}, [](V x) { return weighted(ops::relu(x[0])); }, -1, 1, true},
      {"sigmoid", {{6}}, [](V x) { return weighted(ops::sigmoid(x[0])); }, -3, 3},
      {"tanh", {{6}}, [](V x) { return weighted(ops::tanh(x[0])); }, -2, 2},
      {"gelu", {{8}}, [](V x) { return weighted(ops::gelu(x[0])); }, -3, 3},
      {"matmul", {{2, 3, 4}, {4, 5}}, [](V x) { return weighted(ops::matmul(x[0], x[1])); }},
      {"matmul (transpose_b)", {{3, 4}, {5, 4}}, [](V x) { return weighted(ops::matmul(x[0], x[1], false, true)); }},
      {"matmul (transpose_a)", {{6, 3}, {6, 2}}, [](V x) { return weighted(ops::matmul(x[0], x[1], true)); }},
      {"linear", {{3, 4}, {4, 5}, {5}}, [](V x) { return weighted(ops::linear(x[0], x[1], x[2])); }},
      {"linear (relu)", {{3, 4}, {4, 5}, {5}}, [](V x) { return weighted(ops::linear(x[0], x[1], x[2], true)); }},
      {"linear (one row)", {{4}, {4, 3}, {3}}, [](V x) { return weighted(ops::linear(x[0], x[1], x[2])); }},
      {"sum", {{3, 4}}, [](V x) { return ops::multiply(ops::sum(ops::square(x[0])), ops::sum(x[0])); }},
      {"mean", {{3, 4}}, [](V x) { return ops::mean(ops::multiply(x[0], x[0])); }},
      {"sum_rows", {{3, 2, 2}}, [](V x) { return weighted(ops::sum_rows(x[0])); }},
      {"mean_rows", {{4, 3}}, [](V x) { return weighted(ops::mean_rows(x[0])); }},
      {"reshape", {{3, 4}}, [](V x) { return weighted(ops::reshape(ops::square(x[0]), {2, 6})); }},
      {"conv2d (same, bias)", {{2, 5, 5, 2}, {3, 3, 2, 3}, {3}},
       [](V x) { return weighted(ops::conv2d(x[0], x[1], x[2])); }},
      {"conv2d (valid, stride 2)", {{1, 6, 5, 2}, {2, 3, 2, 2}},
       [](V x) { return weighted(ops::conv2d(x[0], x[1], Array(), {.stride_h = 2, .stride_w = 2, .same = false})); }},
      {"conv2d (relu, active)", {{1, 4, 4, 1}, {3, 3, 1, 2}, {2}},
       [](V x) { return weighted(ops::conv2d(x[0], x[1], x[2], {.relu = true})); }, 0.1f, 1.0f},
      {"avg_pool", {{2, 5, 5, 2}}, [](V x) { return weighted(ops::avg_pool(ops::square(x[0]), 2, 2, 2, 2)); }},
      {"global_avg_pool", {{2, 3, 4, 3}}, [](V x) { return weighted(ops::global_avg_pool(ops::exp(x[0]))); }},
      {"batch_norm (train)", {{4, 2, 3}, {3}, {3}},
       [](V x) {
         auto r = ops::batch_norm(x[0], x[1], x[2], pmap::Array(Shape{3}, pmap::DType::f32), host({1, 1, 1}, {3}));
         return weighted(r.y);
       }},
      {"batch_norm (train, no gamma, relu)", {{6, 2}, {2}},
       [](V x) {
         auto r = ops::batch_norm(x[0], Array(), x[1], host({0.1f, -0.2f}, {2}), host({1, 2}, {2}), {.relu = true});
         return weighted(ops::square(r.y));
       }},
      {"batch_norm (inference)", {{5, 3}, {3}, {3}},
       [](V x) {
         auto r = ops::batch_norm(x[0], x[1], x[2], host({0.1f, 0.2f, -0.3f}, {3}), host({0.5f, 1.0f, 2.0f}, {3}),
                                  {.train = false});
         return weighted(r.y);
       }},
      {"softmax", {{3, 5}}, [](V x) { return weighted(ops::softmax(x[0])); }, -2, 2},
      {"softmax_cross_entropy", {{4, 5}},
       [](V x) {
         return ops::softmax_cross_entropy(x[0], Array::from_host(random_labels(4, 5, 3), {4}));
       },
       -2, 2},
  };
  return out;
}

TEST_CASE("grad: every primitive's VJP against central differences") {
  for (const Case& c : cases()) check_against_differences(c);
}

TEST_CASE("grad: a fused ReLU (linear, conv2d) has the gradients of relu after the unfused op, bit for bit") {
  const Array x = host(random_floats(2 * 5 * 5 * 2, 3), {2, 5, 5, 2}), w = host(random_floats(3 * 3 * 2 * 4, 4), {3, 3, 2, 4});
  const Array b = host(random_floats(4, 5), {4});
  auto fused = pmap::grad<0, 1, 2>([](const Array& xs, const Array& ws, const Array& bs) {
    return weighted(ops::conv2d(xs, ws, bs, {.relu = true}));
  })(x, w, b);
  auto plain = pmap::grad<0, 1, 2>([](const Array& xs, const Array& ws, const Array& bs) {
    return weighted(ops::relu(ops::conv2d(xs, ws, bs)));
  })(x, w, b);
  CHECK(std::get<0>(fused).to_vector<float>() == std::get<0>(plain).to_vector<float>());
  CHECK(std::get<1>(fused).to_vector<float>() == std::get<1>(plain).to_vector<float>());
  CHECK(std::get<2>(fused).to_vector<float>() == std::get<2>(plain).to_vector<float>());
  const Array xl = host(random_floats(15, 6), {5, 3}), wl = host(random_floats(12, 7), {3, 4}), bl = host(random_floats(4, 8), {4});
  auto lf = pmap::grad<0, 1, 2>([](const Array& a, const Array& m, const Array& c) { return weighted(ops::linear(a, m, c, true)); })(xl, wl, bl);
  auto lp = pmap::grad<0, 1, 2>([](const Array& a, const Array& m, const Array& c) {
    return weighted(ops::relu(ops::linear(a, m, c)));
  })(xl, wl, bl);
  CHECK(std::get<0>(lf).to_vector<float>() == std::get<0>(lp).to_vector<float>());
  CHECK(std::get<1>(lf).to_vector<float>() == std::get<1>(lp).to_vector<float>());
  CHECK(std::get<2>(lf).to_vector<float>() == std::get<2>(lp).to_vector<float>());
}

TEST_CASE("grad: a ReLU's mask fused into avg_pool's VJP gives the unfused gradients, bit for bit") {
  using pmap::core::Trace;
  const Array b = host(random_floats(4, 25), {4});
  struct Shape4 {
    std::int64_t h;
    int window, stride;
  };
  // (5x5 with 2x2 windows of stride 2: the last row and column are in no window; 6x6 stride 1: overlapping)
  for (const Shape4& g : {Shape4{5, 2, 2}, Shape4{6, 2, 1}, Shape4{6, 3, 3}}) {
    CAPTURE(g.h);
    CAPTURE(g.window);
    CAPTURE(g.stride);
    const Array x = host(random_floats(static_cast<std::size_t>(2 * g.h * g.h * 2), 21), {2, g.h, g.h, 2});
    const Array w = host(random_floats(3 * 3 * 2 * 4, 22), {3, 3, 2, 4});
    const auto pool = [&](const Array& r) { return ops::avg_pool(r, g.window, g.window, g.stride, g.stride); };
    const std::uint64_t before = Trace::fused_relu_masks(), over = Trace::masks_over_input();
    auto fused = pmap::grad<0, 1, 2>([&](const Array& xs, const Array& ws, const Array& bs) {
      return weighted(pool(ops::conv2d(xs, ws, bs, {.relu = true})));
    })(x, w, b);
    CHECK(Trace::fused_relu_masks() == before + 1);
    CHECK(Trace::masks_over_input() == over + 1);  // the pool reads r alone: written over r
    auto plain = pmap::grad<0, 1, 2>([&](const Array& xs, const Array& ws, const Array& bs) {
      return weighted(pool(ops::relu(ops::conv2d(xs, ws, bs))));
    })(x, w, b);
    CHECK(Trace::fused_relu_masks() == before + 1);  // a separate relu: nothing to fuse into
    CHECK(std::get<0>(fused).to_vector<float>() == std::get<0>(plain).to_vector<float>());
    CHECK(std::get<1>(fused).to_vector<float>() == std::get<1>(plain).to_vector<float>());
    CHECK(std::get<2>(fused).to_vector<float>() == std::get<2>(plain).to_vector<float>());
    // The ReLU's output read twice (the pool and a sum): not fused, and still the unfused gradients.
    auto twice = pmap::grad<1>([&](const Array& xs, const Array& ws) {
      Array r = ops::conv2d(xs, ws, Array(), {.relu = true});
      return ops::add(weighted(pool(r)), ops::sum(r));
    })(x, w);
    auto twice_plain = pmap::grad<1>([&](const Array& xs, const Array& ws) {
      Array r = ops::relu(ops::conv2d(xs, ws));
      return ops::add(weighted(pool(r)), ops::sum(r));
    })(x, w);
    CHECK(Trace::fused_relu_masks() == before + 1);
    CHECK(Trace::masks_over_input() == over + 1);
    CHECK(twice.to_vector<float>() == twice_plain.to_vector<float>());
    // ... read by two pools: both fused, neither writes over r (the other still reads it).
    const auto two_pools = [&](bool fuse) {
      return pmap::grad<1>([&](const Array& xs, const Array& ws) {
        Array r = fuse ? ops::conv2d(xs, ws, Array(), {.relu = true}) : ops::relu(ops::conv2d(xs, ws));
        return ops::add(weighted(pool(r)), weighted(ops::avg_pool(r, 1, 1, 1, 1)));
      })(x, w).to_vector<float>();
    };
    const std::vector<float> fused_two = two_pools(true);
    CHECK(Trace::fused_relu_masks() == before + 2);
    CHECK(Trace::masks_over_input() == over + 1);
    CHECK(fused_two == two_pools(false));
    // The ReLU's output returned as the auxiliary result: fused and written over, and the result still
    // holds the activation (made independent of the trace before the backward pass).
    auto [with_aux, aux] = pmap::grad<1>([&](const Array& xs, const Array& ws) {
      Array r = ops::conv2d(xs, ws, Array(), {.relu = true});
      Array loss = weighted(pool(r));
      return std::make_pair(std::move(loss), std::move(r));
    })(x, w);
    CHECK(Trace::fused_relu_masks() == before + 3);
    CHECK(Trace::masks_over_input() == over + 2);
    CHECK(aux.to_vector<float>() == ops::relu(ops::conv2d(x, w)).to_vector<float>());
    auto aux_plain = pmap::grad<1>([&](const Array& xs, const Array& ws) {
      return weighted(pool(ops::relu(ops::conv2d(xs, ws))));
    })(x, w);
    CHECK(with_aux.to_vector<float>() == aux_plain.to_vector<float>());
    // linear's fused ReLU over the channels of images, then the pool.
    const Array wl = host(random_floats(2 * 3, 23), {2, 3}), bl = host(random_floats(3, 24), {3});
    auto lf = pmap::grad<0, 1>([&](const Array& ws, const Array& bs) { return weighted(pool(ops::linear(x, ws, bs, true))); })(wl, bl);
    CHECK(Trace::fused_relu_masks() == before + 4);
    CHECK(Trace::masks_over_input() == over + 3);
    auto lp = pmap::grad<0, 1>([&](const Array& ws, const Array& bs) {
      return weighted(pool(ops::relu(ops::linear(x, ws, bs))));
    })(wl, bl);
    CHECK(std::get<0>(lf).to_vector<float>() == std::get<0>(lp).to_vector<float>());
    CHECK(std::get<1>(lf).to_vector<float>() == std::get<1>(lp).to_vector<float>());
    // The eager op behind it: the same bits, in r's own storage.
    Array r = ops::relu(ops::conv2d(x, w));
    const Array dy = host(random_floats(static_cast<std::size_t>(pool(r).size()), 28), pool(r).shape());
    const std::vector<float> want = ops::eager::avg_pool_relu_backward(r, dy, g.window, g.window, g.stride, g.stride)
                                        .to_vector<float>();
    const void* storage = r.raw_data();
    const Array got = ops::eager::avg_pool_relu_backward_over(std::move(r), dy, g.window, g.window, g.stride, g.stride);
    CHECK(got.raw_data() == storage);
    CHECK(got.to_vector<float>() == want);
  }
  // Inside vmap (stacked weights: one conv call for both members), each member's gradient as without fusion.
  const Array x = host(random_floats(2 * 6 * 6 * 2, 26), {2, 6, 6, 2});
  const Array ws = host(random_floats(2 * 3 * 3 * 2 * 4, 27), {2, 3, 3, 2, 4});
  const std::uint64_t before = Trace::fused_relu_masks();
  const auto member_grad = [&](bool fuse) {
    return pmap::vmap([&](const Array& w) {
      return pmap::grad([&](const Array& v) {
        Array r = fuse ? ops::conv2d(x, v, Array(), {.relu = true}) : ops::relu(ops::conv2d(x, v));
        return weighted(ops::avg_pool(r, 2, 2, 2, 2));
      }, "member")(w);
    }, {0}, "members")(ws).to_vector<float>();
  };
  const std::uint64_t over = Trace::masks_over_input();
  const std::vector<float> vf = member_grad(true);
  CHECK(Trace::fused_relu_masks() == before + 1);
  CHECK(Trace::masks_over_input() == over + 1);
  CHECK(vf == member_grad(false));
}

TEST_CASE("grad: batch_norm's state and dropout's mask") {
  const Array x = host(random_floats(24, 31), {8, 3});
  Array mean(Shape{3}, pmap::DType::f32), var = host({1, 1, 1}, {3});
  // the moving statistics move toward the batch's (biased variance), momentum 0.9
  auto r = ops::batch_norm(x, Array(), Array(), mean, var, {.momentum = 0.9f});
  const auto xs = x.to_vector<float>();
  for (int c = 0; c < 3; ++c) {
    double s = 0, q = 0;
    for (int i = 0; i < 8; ++i) s += xs[static_cast<std::size_t>(i * 3 + c)], q += xs[static_cast<std::size_t>(i * 3 + c)] * xs[static_cast<std::size_t>(i * 3 + c)];
    const double m = s / 8, v = q / 8 - m * m;
    CHECK(r.moving_mean.to_vector<float>()[static_cast<std::size_t>(c)] == doctest::Approx(0.1 * m).epsilon(1e-5));
    CHECK(r.moving_variance.to_vector<float>()[static_cast<std::size_t>(c)] == doctest::Approx(0.9 + 0.1 * v).epsilon(1e-5));
  }
  CHECK(mean.to_vector<float>() == std::vector<float>(3, 0.0f));  // the inputs are left as they are
  // through grad, the new state comes back as the auxiliary result
  auto [value_aux, g] = pmap::value_and_grad([&](const Array& xx) {
    auto b = ops::batch_norm(xx, Array(), Array(), mean, var, {.momentum = 0.9f});
    return std::make_pair(ops::sum(ops::square(b.y)), std::vector<Array>{});
  })(x);
  CHECK(g.shape() == x.shape());
  // dropout: the gradient is the same mask applied to the cotangent; the mask of a row depends on its
  // global index only (two halves with offsets equal the whole)
  const Array key = Array::from_host(std::vector<std::uint32_t>{7, 9}, {2});
  const Array step = Array::from_host(std::vector<std::int64_t>{3}, {1});
  const Array w = host(random_floats(24, 32), {8, 3});
  auto gd = pmap::grad([&](const Array& xx) {
    return ops::sum(ops::multiply(ops::dropout(xx, key, step, {.rate = 0.5f}), w));
  })(x);
  CHECK(gd.to_vector<float>() == pmap::ops::eager::dropout(w, key, step, {.rate = 0.5f}).to_vector<float>());
  const auto whole = ops::dropout(x, key, step, {.rate = 0.5f}).to_vector<float>();
  auto half = [&](std::int64_t first) {
    std::vector<float> v(xs.begin() + first * 3, xs.begin() + (first + 4) * 3);
    return ops::dropout(host(v, {4, 3}), key, step, {.rate = 0.5f, .example_offset = first}).to_vector<float>();
  };
  auto a = half(0), b = half(4);
  a.insert(a.end(), b.begin(), b.end());
  CHECK(a == whole);
  int zeros = 0;
  for (float v : whole) zeros += v == 0.0f;
  CHECK(zeros > 0);
  CHECK(zeros < 24);
  CHECK_THROWS_AS(ops::dropout(x, key, step, {.rate = 1.0f}), pmap::ValueError);
}

TEST_CASE("grad: the CUDA kernels run on the host give the CPU ops' gradients") {
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const auto in = inputs_of(c, 11);
    auto g = pmap::grad([&](const std::vector<Array>& xs) { return c.f(xs); })(arrays(c, in));
    pmap::ops::detail::ScopedBackend scope(pmap::kernels::cuda_backend_on_host());
    auto h = pmap::grad([&](const std::vector<Array>& xs) { return c.f(xs); })(arrays(c, in));
    for (std::size_t i = 0; i < g.size(); ++i) {
      CHECK(cuda_testing::relative_error(h[i].to_vector<float>(), g[i].to_vector<float>()) <= 1e-5);
    }
  }
}

struct Mlp {
  Array w1, b1, w2;
  float temperature = 1.0f;  // a scalar leaf: its gradient is 0
};
PMAPCC_TREE(Mlp, w1, b1, w2, temperature)

Mlp make_mlp() {
  return {host(random_floats(12, 1), {4, 3}), host(random_floats(3, 2), {3}), host(random_floats(6, 3), {3, 2}), 2.0f};
}

Array mlp_loss(const Mlp& p, const Array& x, const Array& labels) {
  Array h = ops::linear(x, p.w1, p.b1, true);
  return ops::softmax_cross_entropy(ops::matmul(h, p.w2), labels);
}

TEST_CASE("grad over trees: a struct's leaves, argnums, the auxiliary result, scalar leaves") {
  const Mlp p = make_mlp();
  const Array x = host(random_floats(20, 4), {5, 4});
  const Array labels = Array::from_host(random_labels(5, 2, 5), {5});
  auto [loss, g] = pmap::value_and_grad(mlp_loss, "mlp_loss")(p, x, labels);
  CHECK(loss.item<float>() == mlp_loss(p, x, labels).item<float>());
  CHECK(g.w1.shape() == Shape{4, 3});
  CHECK(g.b1.shape() == Shape{3});
  CHECK(g.w2.shape() == Shape{3, 2});
  CHECK(g.temperature == 0.0f);
  // the same gradient through grad, and w.r.t. x too (argnums 0 and 1)
  Mlp g2 = pmap::grad(mlp_loss)(p, x, labels);
  CHECK(g2.w2.to_vector<float>() == g.w2.to_vector<float>());
  auto [v3, gs] = pmap::value_and_grad<0, 1>(mlp_loss)(p, x, labels);
  CHECK(std::get<0>(gs).w1.to_vector<float>() == g.w1.to_vector<float>());
  CHECK(std::get<1>(gs).shape() == Shape{5, 4});
  // has_aux: (value, aux) and (grads, aux)
  auto with_aux = [](const Mlp& q, const Array& xs) {
    Array h = ops::linear(xs, q.w1, q.b1, true);
    std::vector<Array> aux;
    aux.push_back(ops::scale(h, 2.0f));
    return std::make_pair(ops::mean(h), std::move(aux));
  };
  auto [va, ga] = pmap::value_and_grad(with_aux)(p, x);
  CHECK(va.second.size() == 1);
  CHECK(pmap::detail::trace_tag(va.second[0]) == 0);  // results are plain arrays
  CHECK(va.second[0].shape() == Shape{5, 3});
  auto [gg, aux] = pmap::grad(with_aux)(p, x);
  CHECK(gg.b1.to_vector<float>() == ga.b1.to_vector<float>());
  // a leaf nothing flows to gets zeros
  CHECK(ga.w2.to_vector<float>() == std::vector<float>(6, 0.0f));
}

TEST_CASE("grad: a value used several times accumulates, maps, repeated runs give the same bits") {
  std::map<std::string, Array> params;
  params.emplace("a", host({0.5f, -1.0f, 2.0f}, {3}));
  params.emplace("b", host({1.5f}, {}));
  auto f = [](const std::map<std::string, Array>& q) {
    const Array& a = q.at("a");
    Array y = ops::add(ops::multiply(a, a), ops::multiply(a, q.at("b")));  // a^2 + a b
    return ops::sum(ops::add(y, a));                                      // + a
  };
  auto g = pmap::grad(f)(params);
  // d/da = 2a + b + 1, d/db = sum(a)
  CHECK(g.at("a").to_vector<float>() == std::vector<float>{1.0f + 1.5f + 1.0f, -2.0f + 1.5f + 1.0f, 4.0f + 2.5f});
  CHECK(g.at("b").item<float>() == doctest::Approx(1.5));
  const auto again = pmap::grad(f)(params);
  CHECK(std::memcmp(again.at("a").to_vector<float>().data(), g.at("a").to_vector<float>().data(), 12) == 0);
  // stop_gradient: no gradient flows through
  auto h = pmap::grad([](const Array& a) { return ops::sum(ops::multiply(a, ops::stop_gradient(a))); })(params.at("a"));
  CHECK(h.to_vector<float>() == params.at("a").to_vector<float>());
  // a function that ignores its argument: zeros
  auto z = pmap::grad([](const Array&) { return Array::scalar(1.0f); })(params.at("a"));
  CHECK(z.to_vector<float>() == std::vector<float>(3, 0.0f));
}

TEST_CASE("grad: bad input raises pmap::Error naming the function and what is wrong") {
  const Array a = host({1.0f, 2.0f}, {2});
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const pmap::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string vector_valued = message([&] { pmap::grad([](const Array& x) { return ops::square(x); }, "sq")(a); });
  CHECK(vector_valued.find("grad of 'sq'") != std::string::npos);
  CHECK(vector_valued.find("f32(2,)") != std::string::npos);
  CHECK(vector_valued.find("scalar f32") != std::string::npos);
  const Array labels = Array::from_host(std::vector<std::int32_t>{1, 0}, {2});
  const std::string int_valued = message([&] {
    pmap::grad([&](const Array&) { return Array::scalar(std::int32_t{3}); }, "count")(a);
  });
  CHECK(int_valued.find("i32()") != std::string::npos);
  // labels asked for
  std::vector<Array> mixed;
  mixed.push_back(a.copy());
  mixed.push_back(labels.copy());
  const std::string labels_asked =
      message([&] { pmap::grad([](const std::vector<Array>& v) { return ops::sum(v[0]); }, "loss")(mixed); });
  CHECK(labels_asked.find("leaf '1'") != std::string::npos);
  CHECK(labels_asked.find("not differentiable") != std::string::npos);
  // in-place changes of a traced value, and a leaked value
  CHECK(message([&] { pmap::grad([](const Array& x) { return ops::sum(ops::square(x).reshape({2, 1})); })(a); })
            .find("ops::reshape") != std::string::npos);
  Array leaked;
  pmap::grad([&](const Array& x) {
    leaked = ops::square(x);
    return ops::sum(x);
  })(a);
  CHECK(message([&] { ops::add(leaked, a); }).find("after that function returned") != std::string::npos);
  // higher order
  CHECK_THROWS_AS(pmap::grad([](const Array& x) { return ops::sum(pmap::grad([](const Array& y) {
                                                                  return ops::sum(ops::square(y));
                                                                })(x)); })(a),
                  pmap::NotAvailable);
}

}  // namespace

namespace {

std::vector<float> rounded_bf16(std::vector<float> v) {
  for (float& x : v) x = pmap::kernels::bf16::round(x);
  return v;
}

// The largest |a - b| over the largest |b|.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return scale == 0 ? gap : gap / scale;
}

}  // namespace

TEST_CASE("ops::DefaultPrecision: bf16 products (forward and VJP) are fp32 products of bf16-rounded operands") {
  using pmap::kernels::Precision;
  namespace ops = pmap::ops;
  const auto a = cuda_testing::random_floats(6 * 40, 71), b = cuda_testing::random_floats(40 * 5, 72);
  const auto x = cuda_testing::random_floats(2 * 6 * 6 * 3, 73), w = cuda_testing::random_floats(3 * 3 * 3 * 4, 74);
  CHECK(ops::default_precision() == Precision::fp32);
  const bool runs = pmap::kernels::cpu::isa() == "avx512" && pmap::kernels::bf16::supported();
  if (!runs) {  // this CPU (or the generic variant) has no bf16 products: the first product says so
    ops::DefaultPrecision bf16(Precision::bf16);
    CHECK_THROWS_AS(ops::matmul(host(a, {6, 40}), host(b, {40, 5})), pmap::ValueError);
    return;
  }
  const std::vector<float> fp32 = ops::matmul(host(a, {6, 40}), host(b, {40, 5})).to_vector<float>();
  const std::vector<float> expected =
      ops::matmul(host(rounded_bf16(a), {6, 40}), host(rounded_bf16(b), {40, 5})).to_vector<float>();
  std::vector<float> got, conv, conv_expected, dw, dw_expected;
  {
    ops::DefaultPrecision bf16(Precision::bf16);
    CHECK(ops::default_precision() == Precision::bf16);
    {
      ops::DefaultPrecision inner(Precision::fp32);  // scopes nest
      CHECK(ops::default_precision() == Precision::fp32);
    }
    CHECK(ops::default_precision() == Precision::bf16);
    Precision elsewhere = Precision::bf16;
    std::thread([&] { elsewhere = ops::default_precision(); }).join();
    CHECK(elsewhere == Precision::fp32);  // the scope is the calling thread's
    got = ops::matmul(host(a, {6, 40}), host(b, {40, 5})).to_vector<float>();
    conv = ops::conv2d(host(x, {2, 6, 6, 3}), host(w, {3, 3, 3, 4})).to_vector<float>();
    // d sum(linear(x, w, 0)) / dw = x^T ones: the VJP's product is bf16 too (its ones are exact in bf16).
    dw = pmap::grad([&](const Array& wt) { return ops::sum(ops::linear(host(a, {6, 40}), wt, host(std::vector<float>(5, 0.0f), {5}))); },
                    "loss")(host(b, {40, 5}))
             .to_vector<float>();
  }
  CHECK(ops::default_precision() == Precision::fp32);
  // The scope inside the differentiated function: the backward pass runs after it has closed, and the VJP's
  // products are bf16 all the same (each op keeps the precision it was called at).
  const std::vector<float> dw_inside = pmap::grad([&](const Array& wt) {
    ops::DefaultPrecision bf16(Precision::bf16);
    return ops::sum(ops::linear(host(a, {6, 40}), wt, host(std::vector<float>(5, 0.0f), {5})));
  }, "loss")(host(b, {40, 5})).to_vector<float>();
  CHECK(dw_inside == dw);
  conv_expected = ops::conv2d(host(rounded_bf16(x), {2, 6, 6, 3}), host(rounded_bf16(w), {3, 3, 3, 4})).to_vector<float>();
  dw_expected = ops::matmul(host(rounded_bf16(a), {6, 40}), host(std::vector<float>(30, 1.0f), {6, 5}), true).to_vector<float>();
  CHECK(relative_gap(got, expected) < 1e-5);  // the same products, summed in another order
  CHECK(relative_gap(got, fp32) > 1e-4);      // and not the fp32 ones
  CHECK(relative_gap(conv, conv_expected) < 1e-5);
  CHECK(relative_gap(dw, dw_expected) < 1e-5);
}

}  // namespace PMAPCC_TEST_FILE
