// grad inside pmap (pmapcc/core/grad.h): the collectives' transposes on computed expectations, a
// data-parallel step equal to one device's whole-batch gradient, and a model-parallel MLP whose matmuls
// are split over "model" giving the unsplit model's gradients, on 1, 2, 3 and 4 CPU devices.
#include "cuda_testing.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::random_floats;
using cuda_testing::random_labels;
using cuda_testing::relative_error;
using pmap::Array;
using pmap::Shape;
namespace ops = pmap::ops;

pmap::Mesh cpu_mesh(int n, const char* axis) { return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), axis); }

std::vector<float> slice(const std::vector<float>& v, std::size_t begin, std::size_t count) {
  return {v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(begin + count)};
}

// Device d's weights for the collective checks: w_d = (d + 1) * base + d.
std::vector<float> weights(int d, std::size_t n) {
  auto w = random_floats(n, 50);
  for (float& x : w) x = static_cast<float>(d + 1) * x + static_cast<float>(d);
  return w;
}

TEST_CASE("grad through collectives: the transposes grad.h documents, on 1, 2, 3 and 4 devices") {
  const std::size_t k = 3;
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    pmap::Mesh mesh = cpu_mesh(n, "i");
    auto run = [&](auto body) {
      return pmap::pmap([&](int) {
        const int d = pmap::axis_index("i");
        const Array x = Array::from_host(random_floats(k, 60 + static_cast<std::uint32_t>(d)),
                                         {static_cast<std::int64_t>(k)});
        return body(d, x);
      }, mesh)(0);
    };
    // L_d = w_d . op(x_d)
    auto grad_of = [&](auto op, std::size_t out_size) {
      return run([&, out_size](int d, const Array& x) {
        const Array w = Array::from_host(weights(d, out_size), {static_cast<std::int64_t>(out_size)});
        return pmap::grad([&](const Array& v) { return ops::sum(ops::multiply(op(v), w)); })(x);
      });
    };
    const auto psum_g = grad_of([](const Array& v) { return pmap::psum(v, "i"); }, k);
    const auto pmean_g = grad_of([](const Array& v) { return pmap::pmean(v, "i"); }, k);
    const auto gather_g = grad_of([](const Array& v) { return pmap::all_gather(v, "i", true); }, k * n);
    const auto scatter_g = grad_of([&](const Array& v) {  // x_d tiled n times, then psum_scatter'd
      const Array ones = Array::from_host(std::vector<float>(k * n, 1.0f), {n, static_cast<std::int64_t>(k)});
      return pmap::psum_scatter(ops::reshape(ops::multiply(ones, v), {static_cast<std::int64_t>(k * n)}), "i", true);
    }, k);
    std::vector<std::pair<int, int>> shift;
    for (int d = 0; d < n; ++d) shift.emplace_back(d, (d + 1) % n);
    const auto permute_g = grad_of([&](const Array& v) { return pmap::ppermute(v, "i", shift); }, k);
    for (int d = 0; d < n; ++d) {
      CAPTURE(d);
      const auto ud = static_cast<std::size_t>(d);
      // psum: the replicated result's cotangent passes through; pmean: divided by n
      CHECK(psum_g[ud].to_vector<float>() == weights(d, k));
      auto mean_w = weights(d, k);
      for (float& x : mean_w) x /= static_cast<float>(n);
      CHECK(relative_error(pmean_g[ud].to_vector<float>(), mean_w) <= 1e-7);
      // all_gather: block d of the sum over devices of their cotangents
      std::vector<double> block(k, 0.0);
      for (int j = 0; j < n; ++j) {
        const auto w = weights(j, k * n);
        for (std::size_t i = 0; i < k; ++i) block[i] += w[ud * k + i];
      }
      CHECK(relative_error(gather_g[ud].to_vector<float>(), std::vector<float>(block.begin(), block.end())) <= 1e-6);
      // psum_scatter of x_d tiled n times: the cotangent is every device's block gathered, summed over blocks
      std::vector<double> all(k, 0.0);
      for (int j = 0; j < n; ++j) {
        const auto w = weights(j, k);
        for (std::size_t i = 0; i < k; ++i) all[i] += w[i];
      }
      CHECK(relative_error(scatter_g[ud].to_vector<float>(), std::vector<float>(all.begin(), all.end())) <= 1e-6);
      // ppermute d -> d+1: x_d's cotangent is device d+1's weights
      CHECK(permute_g[ud].to_vector<float>() == weights((d + 1) % n, k));
    }
    // pmax is not differentiable
    CHECK_THROWS_AS(grad_of([](const Array& v) { return pmap::pmax(v, "i"); }, k), pmap::NotAvailable);
  }
}

TEST_CASE("grad through all_to_all: each chunk's cotangent comes back from where it went, on 1-4 devices") {
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    pmap::Mesh mesh = cpu_mesh(n, "i");
    const auto un = static_cast<std::size_t>(n);
    // x_d (n, 2); y_d = all_to_all(x_d, split 0, concat 1) is (2, n) with y_d[a][j] = x_j[d][a]; L_d = w_d . y_d.
    // So d(sum of the L)/d x_d[r][a] = w_r[a][d]. Tiled, x_d (2 n, 3) split 0 and concatenated along 1 the same way.
    auto run = [&](bool tiled) {
      return pmap::pmap([&](int) {
        const int d = pmap::axis_index("i");
        const std::int64_t rows = tiled ? 2 * n : n, cols = tiled ? 3 : 2;
        const Array x = Array::from_host(random_floats(static_cast<std::size_t>(rows * cols), 70 + static_cast<std::uint32_t>(d)),
                                         {rows, cols});
        const Shape out = tiled ? Shape{2, 3 * n} : Shape{2, n};
        const Array w = Array::from_host(weights(d, static_cast<std::size_t>(out[0] * out[1])), out);
        return pmap::grad([&](const Array& v) {
          return ops::sum(ops::multiply(pmap::all_to_all(v, "i", 0, 1, tiled), w));
        })(x);
      }, mesh)(0);
    };
    const auto plain = run(false), tiled = run(true);
    for (std::size_t d = 0; d < un; ++d) {
      CAPTURE(d);
      std::vector<float> expect, expect_tiled;
      for (std::size_t r = 0; r < un; ++r) {
        const auto w = weights(static_cast<int>(r), 2 * un), wt = weights(static_cast<int>(r), 6 * un);
        for (std::size_t a = 0; a < 2; ++a) expect.push_back(w[a * un + d]);
        // x_d rows 2r, 2r + 1 went to device r, whose y row i holds them at columns 3 d .. 3 d + 2
        for (std::size_t i = 0; i < 2; ++i)
          for (std::size_t col = 0; col < 3; ++col) expect_tiled.push_back(wt[i * 3 * un + 3 * d + col]);
      }
      CHECK(plain[d].to_vector<float>() == expect);
      CHECK(tiled[d].to_vector<float>() == expect_tiled);
    }
    // Every other pair of axes, negative ones and split == concat, from where the forward exchange (checked
    // against its definition in test_cuda_collectives.cpp) puts each element: x_d[f] carries the id
    // 1000 d + f, so an id at position p of device r's result says that x_d[f]'s gradient is w_r[p].
    struct Axes {
      int s, c;
      bool tiled;
    };
    for (const Axes a : {Axes{1, 0, false}, Axes{-1, -2, false}, Axes{0, 0, true}, Axes{-1, 0, true}, Axes{1, 1, true}}) {
      CAPTURE(a.s);
      CAPTURE(a.c);
      CAPTURE(a.tiled);
      Shape shape{2, 3};
      shape[static_cast<std::size_t>(a.s < 0 ? a.s + 2 : a.s)] = a.tiled ? 2 * n : n;
      const auto size = static_cast<std::size_t>(shape[0] * shape[1]);
      const auto results = pmap::pmap([&](int) {
        const int d = pmap::axis_index("i");
        std::vector<float> id(size);
        for (std::size_t f = 0; f < size; ++f) id[f] = static_cast<float>(1000 * d) + static_cast<float>(f);
        const Array where = pmap::all_to_all(Array::from_host(id, shape), "i", a.s, a.c, a.tiled);
        const Array w = Array::from_host(weights(d, size), where.shape());
        const Array x = Array::from_host(random_floats(size, 80 + static_cast<std::uint32_t>(d)), shape);
        Array g = pmap::grad([&](const Array& v) {
          return ops::sum(ops::multiply(pmap::all_to_all(v, "i", a.s, a.c, a.tiled), w));
        })(x);
        return std::pair(std::move(g), where.to_vector<float>());
      }, mesh)(0);
      std::vector<std::vector<float>> expect(un, std::vector<float>(size, -1.0f));
      for (std::size_t r = 0; r < un; ++r) {
        const auto w = weights(static_cast<int>(r), size);
        const auto& where = results[r].second;
        for (std::size_t p = 0; p < size; ++p) {
          const auto id = static_cast<std::size_t>(where[p]);
          expect[id / 1000][id % 1000] = w[p];
        }
      }
      for (std::size_t d = 0; d < un; ++d) {
        CHECK(results[d].first.shape() == shape);
        CHECK(results[d].first.to_vector<float>() == expect[d]);
      }
    }
  }
}

struct Mlp {
  Array w1, b1, w2;
};
PMAPCC_TREE(Mlp, w1, b1, w2)

Array dp_loss(const Mlp& p, const Array& x, const Array& labels) {
  return ops::softmax_cross_entropy(ops::matmul(ops::linear(x, p.w1, p.b1, true), p.w2), labels);
}

TEST_CASE("grad inside pmap: a data-parallel step's pmean'd gradient is the whole batch's, on 1-4 devices") {
  const std::int64_t batch = 24, in = 5, hidden = 7, classes = 3;
  const auto xs = random_floats(static_cast<std::size_t>(batch * in), 1);
  const auto ys = random_labels(static_cast<std::size_t>(batch), static_cast<int>(classes), 2);
  Mlp p{Array::from_host(random_floats(in * hidden, 3), {in, hidden}), Array::from_host(random_floats(hidden, 4), {hidden}),
        Array::from_host(random_floats(hidden * classes, 5), {hidden, classes})};
  const Mlp whole = pmap::grad(dp_loss)(p, Array::from_host(xs, {batch, in}), Array::from_host(ys, {batch}));
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    pmap::Mesh mesh = cpu_mesh(n, "data");
    auto step = pmap::pmap([](const Mlp& q, const Array& x, const Array& y) {
      Mlp g = pmap::grad(dp_loss, "dp_loss")(q, x, y);
      return pmap::pmean(g, "data");
    }, mesh);
    auto x = pmap::shard(Array::from_host(xs, {batch, in}), mesh);
    auto y = pmap::shard(Array::from_host(ys, {batch}), mesh);
    auto params = pmap::replicate(p, mesh);
    const auto g = step(params, x, y);
    const auto again = step(params, x, y);
    for (int d = 0; d < n; ++d) {
      const auto& gd = g[static_cast<std::size_t>(d)];
      CHECK(relative_error(gd.w1.to_vector<float>(), whole.w1.to_vector<float>()) <= 1e-5);
      CHECK(relative_error(gd.b1.to_vector<float>(), whole.b1.to_vector<float>()) <= 1e-5);
      CHECK(relative_error(gd.w2.to_vector<float>(), whole.w2.to_vector<float>()) <= 1e-5);
      const auto a = gd.w1.to_vector<float>(), b = again[static_cast<std::size_t>(d)].w1.to_vector<float>();
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);  // run after run
    }
  }
}

// The unsplit model: y = relu(x w1 + b1) w2 + b2, loss = mean((y - t)^2).
struct Megatron {
  Array w1, b1, w2, b2;  // w1 (I, H/n) and b1 (H/n): columns; w2 (H/n, O): rows; b2 (O) replicated
};
PMAPCC_TREE(Megatron, w1, b1, w2, b2)

Array mp_loss(const Megatron& p, const Array& x, const Array& t, bool split) {
  Array partial = ops::matmul(ops::linear(x, p.w1, p.b1, true), p.w2);
  Array y = ops::add(split ? pmap::psum(partial, "model") : std::move(partial), p.b2);
  return ops::mean(ops::square(ops::subtract(y, t)));
}

TEST_CASE("grad inside pmap: a model-parallel MLP split over 'model' gives the unsplit model's gradients") {
  const std::int64_t rows = 6, in = 4, hidden = 12, out = 3;
  const auto xs = random_floats(static_cast<std::size_t>(rows * in), 7), ts = random_floats(static_cast<std::size_t>(rows * out), 8);
  const auto w1 = random_floats(static_cast<std::size_t>(in * hidden), 9), b1 = random_floats(static_cast<std::size_t>(hidden), 10);
  const auto w2 = random_floats(static_cast<std::size_t>(hidden * out), 11), b2 = random_floats(static_cast<std::size_t>(out), 12);
  const Megatron full{Array::from_host(w1, {in, hidden}), Array::from_host(b1, {hidden}),
                      Array::from_host(w2, {hidden, out}), Array::from_host(b2, {out})};
  const Array x = Array::from_host(xs, {rows, in}), t = Array::from_host(ts, {rows, out});
  const Megatron g = pmap::grad([&](const Megatron& p) { return mp_loss(p, x, t, false); })(full);
  const auto gw1 = g.w1.to_vector<float>(), gb1 = g.b1.to_vector<float>(), gw2 = g.w2.to_vector<float>();
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const std::int64_t h = hidden / n;
    pmap::Mesh mesh = cpu_mesh(n, "model");
    std::vector<Megatron> shards;
    for (int d = 0; d < n; ++d) {
      std::vector<float> w1d;
      for (std::int64_t r = 0; r < in; ++r)
        for (std::int64_t c = 0; c < h; ++c) w1d.push_back(w1[static_cast<std::size_t>(r * hidden + d * h + c)]);
      shards.push_back({Array::from_host(w1d, {in, h}), Array::from_host(slice(b1, static_cast<std::size_t>(d * h), static_cast<std::size_t>(h)), {h}),
                        Array::from_host(slice(w2, static_cast<std::size_t>(d * h * out), static_cast<std::size_t>(h * out)), {h, out}),
                        Array::from_host(b2, {out})});
    }
    auto grads = pmap::pmap([&](const Megatron& p) {
      return pmap::grad([&](const Megatron& q) { return mp_loss(q, x, t, true); }, "mp_loss")(p);
    }, mesh)(pmap::Sharded<Megatron>(std::move(shards)));
    for (int d = 0; d < n; ++d) {
      CAPTURE(d);
      const Megatron& gd = grads[static_cast<std::size_t>(d)];
      std::vector<float> want_w1;
      for (std::int64_t r = 0; r < in; ++r)
        for (std::int64_t c = 0; c < h; ++c) want_w1.push_back(gw1[static_cast<std::size_t>(r * hidden + d * h + c)]);
      CHECK(relative_error(gd.w1.to_vector<float>(), want_w1) <= 1e-5);
      CHECK(relative_error(gd.b1.to_vector<float>(), slice(gb1, static_cast<std::size_t>(d * h), static_cast<std::size_t>(h))) <= 1e-5);
      CHECK(relative_error(gd.w2.to_vector<float>(), slice(gw2, static_cast<std::size_t>(d * h * out), static_cast<std::size_t>(h * out))) <= 1e-5);
      CHECK(relative_error(gd.b2.to_vector<float>(), g.b2.to_vector<float>()) <= 1e-6);  // replicated: whole
    }
  }
}

// The column-parallel layer's input x is invariant: pvary makes its gradient the sum of the blocks' (the unsplit
// model's); without it each device holds only its own block's part. all_gather_invariant makes the hidden features
// whole again for a layer that needs them whole (here the second layer, unsplit): each block's cotangent is the
// device's block of the whole's.
Array tp_loss(const Megatron& p, const Array& x, const Array& t, int mode) {
  // mode 0: unsplit; 1: column then row (psum); 2: column then gathered whole (w2 whole); 3: as 1 without pvary;
  // 4: as 2, gathered stacked along a new axis 0 and transposed back.
  const bool split = mode != 0;
  Array h = split && mode != 3 ? ops::linear(pmap::pvary(x, "model"), p.w1, p.b1, true)
                                : ops::linear(x, p.w1, p.b1, true);
  if (mode == 2) h = pmap::all_gather_invariant(h, "model", 1, true);
  if (mode == 4) {  // (n, rows, H/n) -> (rows, n, H/n) -> (rows, H)
    const std::int64_t rows = h.dim(0), block = h.dim(1);
    h = pmap::all_gather_invariant(h, "model");
    h = ops::reshape(ops::transpose(h, {1, 0, 2}), {rows, h.dim(0) * block});
  }
  Array partial = ops::matmul(h, p.w2);
  Array y = ops::add(mode == 1 || mode == 3 ? pmap::psum(partial, "model") : std::move(partial), p.b2);
  return ops::mean(ops::square(ops::subtract(y, t)));
}

TEST_CASE("grad inside pmap: pvary and all_gather_invariant give the unsplit model's input and weight gradients") {
  const std::int64_t rows = 5, in = 3, hidden = 12, out = 2;
  const auto xs = random_floats(static_cast<std::size_t>(rows * in), 21);
  const auto ts = random_floats(static_cast<std::size_t>(rows * out), 22);
  const auto w1 = random_floats(static_cast<std::size_t>(in * hidden), 23);
  const auto b1 = random_floats(static_cast<std::size_t>(hidden), 24);
  const auto w2 = random_floats(static_cast<std::size_t>(hidden * out), 25);
  const auto b2 = random_floats(static_cast<std::size_t>(out), 26);
  const Megatron full{Array::from_host(w1, {in, hidden}), Array::from_host(b1, {hidden}),
                      Array::from_host(w2, {hidden, out}), Array::from_host(b2, {out})};
  const Array x = Array::from_host(xs, {rows, in}), t = Array::from_host(ts, {rows, out});
  auto [g, gx] = pmap::grad<0, 1>([&](const Megatron& p, const Array& v) { return tp_loss(p, v, t, 0); })(full, x);
  const auto want_x = gx.to_vector<float>(), gw1 = g.w1.to_vector<float>(), gw2 = g.w2.to_vector<float>();
  for (int n : {1, 2, 3}) {
    const std::int64_t h = hidden / n;
    pmap::Mesh mesh = cpu_mesh(n, "model");
    for (int mode : {1, 2, 3, 4}) {
      CAPTURE(n);
      CAPTURE(mode);
      const bool w2_whole = mode == 2 || mode == 4;
      std::vector<Megatron> shards;
      for (int d = 0; d < n; ++d) {
        std::vector<float> w1d;
        for (std::int64_t r = 0; r < in; ++r)
          for (std::int64_t c = 0; c < h; ++c) w1d.push_back(w1[static_cast<std::size_t>(r * hidden + d * h + c)]);
        const auto first = static_cast<std::size_t>(d * h);
        shards.push_back({Array::from_host(w1d, {in, h}),
                          Array::from_host(slice(b1, first, static_cast<std::size_t>(h)), {h}),
                          w2_whole ? full.w2.copy()
                                   : Array::from_host(slice(w2, first * out, static_cast<std::size_t>(h * out)),
                                                      {h, out}),
                          Array::from_host(b2, {out})});
      }
      auto grads = pmap::pmap([&](const Megatron& p) {
        return pmap::grad<0, 1>([&](const Megatron& q, const Array& v) { return tp_loss(q, v, t, mode); })(p, x);
      }, mesh)(pmap::Sharded<Megatron>(std::move(shards)));
      std::vector<float> sum_x(want_x.size(), 0.0f);
      for (int d = 0; d < n; ++d) {
        CAPTURE(d);
        const auto& [gd, gxd] = grads[static_cast<std::size_t>(d)];
        std::vector<float> want_w1;
        for (std::int64_t r = 0; r < in; ++r)
          for (std::int64_t c = 0; c < h; ++c) want_w1.push_back(gw1[static_cast<std::size_t>(r * hidden + d * h + c)]);
        CHECK(relative_error(gd.w1.to_vector<float>(), want_w1) <= 1e-5);
        CHECK(relative_error(gd.w2.to_vector<float>(),
                             w2_whole ? gw2
                                      : slice(gw2, static_cast<std::size_t>(d * h * out),
                                              static_cast<std::size_t>(h * out))) <= 1e-5);
        const auto xd = gxd.to_vector<float>();
        if (mode == 3) {  // no pvary: each device's part of x's gradient, which sum to the whole
          for (std::size_t i = 0; i < xd.size(); ++i) sum_x[i] += xd[i];
        } else {
          CHECK(relative_error(xd, want_x) <= 1e-5);
        }
      }
      if (mode == 3) {
        CHECK(relative_error(sum_x, want_x) <= 1e-5);
        if (n > 1) CHECK(relative_error(std::get<1>(grads[0]).to_vector<float>(), want_x) > 1e-2);
      }
    }
  }
  // Outside pmap's trace: pvary is x; all_gather_invariant refuses an axis outside x.
  pmap::Mesh two = cpu_mesh(2, "model");
  auto plain = pmap::pmap([](const Array& v) {
    return std::make_pair(pmap::pvary(v, "model"), pmap::all_gather_invariant(v, "model", 1, true));
  }, two)(pmap::replicate(x, two));
  CHECK(plain[1].first.to_vector<float>() == xs);
  CHECK(plain[1].second.shape() == Shape{rows, 2 * in});
  CHECK_THROWS_WITH_AS(pmap::pmap([](const Array& v) { return pmap::all_gather_invariant(v, "model", 2, true); },
                                  two)(pmap::replicate(x, two)),
                       doctest::Contains("all_gather_invariant: axis 2 is outside"), pmap::ValueError);
}

struct Norm {
  Array gamma, beta;
};
PMAPCC_TREE(Norm, gamma, beta)

// mean(square(batch_norm(x))) with the statistics of the batch over "data" when split.
Array bn_loss(const Norm& p, const Array& x, bool split) {
  const pmap::Device d = x.device();
  const Array mean(Shape{3}, pmap::DType::f32, d), var = Array::from_host(std::vector<float>{1, 1, 1}, {3}, d);
  auto r = ops::batch_norm(x, p.gamma, p.beta, mean, var, {.axis_name = split ? pmap::AxisNames("data") : pmap::AxisNames()});
  return ops::mean(ops::square(ops::add(r.y, Array::from_host(std::vector<float>{0.5f, -1.0f, 0.25f}, {3}, d))));
}

TEST_CASE("grad inside pmap: batch_norm over 'data' uses the whole batch's statistics, on 1-4 devices") {
  const std::int64_t rows = 12;
  const auto xs = random_floats(static_cast<std::size_t>(rows * 3), 41);
  const Norm p{Array::from_host(random_floats(3, 42, 0.5f, 1.5f), {3}), Array::from_host(random_floats(3, 43), {3})};
  const Array x = Array::from_host(xs, {rows, 3});
  const Norm whole = pmap::grad([](const Norm& q, const Array& xx) { return bn_loss(q, xx, false); })(p, x);
  const auto y_whole = ops::batch_norm(x, p.gamma, p.beta, Array(Shape{3}, pmap::DType::f32),
                                       Array::from_host(std::vector<float>{1, 1, 1}, {3}));
  for (int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    pmap::Mesh mesh = cpu_mesh(n, "data");
    // the gradient with respect to x is that of the sum of the devices' losses (n times the mean)
    const Array scaled = pmap::grad<1>([&](const Norm& q, const Array& xx) {
      return ops::scale(bn_loss(q, xx, false), static_cast<float>(n));
    })(p, x);
    auto out = pmap::pmap([](const Norm& q, const Array& xd) {
      auto [g, gx] = pmap::grad<0, 1>([](const Norm& qq, const Array& xx) { return bn_loss(qq, xx, true); })(q, xd);
      const Array mean(Shape{3}, pmap::DType::f32, xd.device());
      const Array var = Array::from_host(std::vector<float>{1, 1, 1}, {3}, xd.device());
      auto r = ops::batch_norm(xd, q.gamma, q.beta, mean, var, {.axis_name = "data"});
      return std::make_tuple(pmap::pmean(g, "data"), std::move(gx), std::move(r.y), std::move(r.moving_variance));
    }, mesh)(pmap::replicate(p, mesh), pmap::shard(x, mesh));
    const std::int64_t per = rows / n;
    for (int d = 0; d < n; ++d) {
      CAPTURE(d);
      const auto& [g, gx, y, mv] = out[static_cast<std::size_t>(d)];
      CHECK(relative_error(g.gamma.to_vector<float>(), whole.gamma.to_vector<float>()) <= 1e-5);
      CHECK(relative_error(g.beta.to_vector<float>(), whole.beta.to_vector<float>()) <= 1e-5);
      const auto want_x = slice(scaled.to_vector<float>(), static_cast<std::size_t>(d * per * 3), static_cast<std::size_t>(per * 3));
      CHECK(relative_error(gx.to_vector<float>(), want_x) <= 1e-5);
      const auto want_y = slice(y_whole.y.to_vector<float>(), static_cast<std::size_t>(d * per * 3), static_cast<std::size_t>(per * 3));
      CHECK(relative_error(y.to_vector<float>(), want_y) <= 1e-5);
      CHECK(relative_error(mv.to_vector<float>(), y_whole.moving_variance.to_vector<float>()) <= 1e-6);
    }
  }
}

TEST_CASE("grad inside pmap: batch_norm over blocks of different sizes counts every device's rows (batch_examples)") {
  // 7 rows on 3 devices, blocks of 3, 2 and 2: with batch_examples 7 the statistics, outputs and moving
  // statistics are the whole batch's, and with each device's loss its sum over the whole batch's elements,
  // the psum'd parameter gradients and each block's input gradient are the whole batch's.
  const std::int64_t rows = 7;
  const auto xs = random_floats(static_cast<std::size_t>(rows * 3), 44);
  const Norm p{Array::from_host(random_floats(3, 45, 0.5f, 1.5f), {3}), Array::from_host(random_floats(3, 46), {3})};
  const Array x = Array::from_host(xs, {rows, 3});
  const Norm whole = pmap::grad([](const Norm& q, const Array& xx) { return bn_loss(q, xx, false); })(p, x);
  const Array whole_x = pmap::grad<1>([](const Norm& q, const Array& xx) { return bn_loss(q, xx, false); })(p, x);
  const auto y_whole = ops::batch_norm(x, p.gamma, p.beta, Array(Shape{3}, pmap::DType::f32),
                                       Array::from_host(std::vector<float>{1, 1, 1}, {3}));
  const std::int64_t first[] = {0, 3, 5, 7};
  pmap::Mesh mesh = cpu_mesh(3, "data");
  auto out = pmap::pmap([&](const Norm& q, const Array& all) {
    const int d = pmap::axis_index("data");
    const Array xd = all.slice_rows(first[d], first[d + 1], pmap::current_device());
    auto loss = [&](const Norm& qq, const Array& xx, Array* y, Array* moving_variance) {
      const Array mean(Shape{3}, pmap::DType::f32, xx.device());
      const Array var = Array::from_host(std::vector<float>{1, 1, 1}, {3}, xx.device());
      auto r = ops::batch_norm(xx, qq.gamma, qq.beta, mean, var, {.axis_name = "data", .batch_examples = rows});
      if (y != nullptr) *y = r.y.copy();
      if (moving_variance != nullptr) *moving_variance = r.moving_variance.copy();
      const Array shifted = ops::add(r.y, Array::from_host(std::vector<float>{0.5f, -1.0f, 0.25f}, {3}, xx.device()));
      return ops::scale(ops::sum(ops::square(shifted)), 1.0f / static_cast<float>(rows * 3));
    };
    Array y, mv;
    loss(q, xd, &y, &mv);
    auto [g, gx] = pmap::grad<0, 1>([&](const Norm& qq, const Array& xx) { return loss(qq, xx, nullptr, nullptr); })(
        q, xd);
    return std::make_tuple(pmap::psum(g, "data"), std::move(gx), std::move(y), std::move(mv));
  }, mesh)(pmap::replicate(p, mesh), pmap::replicate(x, mesh));
  for (int d = 0; d < 3; ++d) {
    CAPTURE(d);
    const auto& [g, gx, y, mv] = out[static_cast<std::size_t>(d)];
    const auto begin = static_cast<std::size_t>(first[d] * 3);
    const auto count = static_cast<std::size_t>((first[d + 1] - first[d]) * 3);
    CHECK(relative_error(g.gamma.to_vector<float>(), whole.gamma.to_vector<float>()) <= 1e-5);
    CHECK(relative_error(g.beta.to_vector<float>(), whole.beta.to_vector<float>()) <= 1e-5);
    CHECK(relative_error(gx.to_vector<float>(), slice(whole_x.to_vector<float>(), begin, count)) <= 1e-5);
    CHECK(relative_error(y.to_vector<float>(), slice(y_whole.y.to_vector<float>(), begin, count)) <= 1e-5);
    CHECK(relative_error(mv.to_vector<float>(), y_whole.moving_variance.to_vector<float>()) <= 1e-6);
  }
  // The count must be this device's rows or more, and means the devices of an axis, in training.
  const Array m(Shape{3}, pmap::DType::f32), v = Array::from_host(std::vector<float>{1, 1, 1}, {3});
  CHECK_THROWS_WITH_AS(ops::batch_norm(x, p.gamma, p.beta, m, v, {.batch_examples = -1}),
                       "ops::batch_norm: batch_examples -1 must be >= 0 (0: x.dim(0) times the axis size)",
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(ops::batch_norm(x, p.gamma, p.beta, m, v, {.batch_examples = 7}),
                       "ops::batch_norm: batch_examples 7 counts the examples of every device's batch: it needs train "
                       "and an axis_name",
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(ops::batch_norm(x, p.gamma, p.beta, m, v, {.train = false, .axis_name = "data",
                                                                  .batch_examples = 7}),
                       doctest::Contains("batch_examples 7 counts the examples of every device's batch: it needs "
                                         "train"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(ops::batch_norm(p.gamma, Array(), Array(), m, v, {.axis_name = "data", .batch_examples = 3}),
                       "ops::batch_norm: batch_examples 3 needs x (N, ..., C) with N <= 3, got f32(3,)",
                       pmap::ValueError);
  const pmap::Mesh one = cpu_mesh(1, "data");
  CHECK_THROWS_WITH_AS(pmap::pmap([&](const Array& xx) {
                         return ops::batch_norm(xx, Array(), Array(), m.to(xx.device()), v.to(xx.device()),
                                                {.axis_name = "data", .batch_examples = 6}).y;
                       }, one)(pmap::replicate(x, one)),
                       doctest::Contains("ops::batch_norm: batch_examples 6 needs x (N, ..., C) with N <= 6, got "
                                         "f32(7, 3)"),
                       pmap::ValueError);
}

// A small CNN: conv (SAME, fused ReLU) -> avg_pool -> dense, the mean cross-entropy.
struct Cnn {
  Array w, b, dense, dense_b;
};
PMAPCC_TREE(Cnn, w, b, dense, dense_b)

Array cnn_loss(const Cnn& p, const Array& x, const Array& labels) {
  Array h = ops::avg_pool(ops::conv2d(x, p.w, p.b, {.relu = true}), 2, 2, 2, 2);  // (N, 3, 3, 4)
  return ops::softmax_cross_entropy(ops::linear(ops::reshape(h, {x.dim(0), 36}), p.dense, p.dense_b), labels);
}

TEST_CASE("ops on cuda devices: grad inside pmap gives the CPU's gradients (one device per GPU)") {
  PMAPCC_REQUIRE_GPU();
  const auto xs = random_floats(4 * 6 * 6 * 2, 21);
  const auto ys = random_labels(4, 5, 22);
  const auto w = random_floats(3 * 3 * 2 * 4, 23), b = random_floats(4, 24), d = random_floats(36 * 5, 25),
             db = random_floats(5, 26);
  auto make = [&](const pmap::Device& dev) {
    return Cnn{Array::from_host(w, {3, 3, 2, 4}, dev), Array::from_host(b, {4}, dev),
               Array::from_host(d, {36, 5}, dev), Array::from_host(db, {5}, dev)};
  };
  const Cnn cpu = pmap::grad(cnn_loss)(make({}), Array::from_host(xs, {4, 6, 6, 2}), Array::from_host(ys, {4}));
  const int gpus = std::min(2, pmap::cuda_status().count);
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cuda, gpus), "i");
  auto out = pmap::pmap([&](int) {
    const pmap::Device dev = pmap::current_device();
    Cnn g = pmap::grad(cnn_loss, "cnn_loss")(make(dev), Array::from_host(xs, {4, 6, 6, 2}, dev),
                                              Array::from_host(ys, {4}, dev));
    return pmap::pmean(g, "i");  // the same gradient on every device: pmean leaves it (to rounding)
  }, mesh)(0);
  for (const Cnn& g : out) {
    CHECK(relative_error(g.w.to_vector<float>(), cpu.w.to_vector<float>()) <= 1e-5);
    CHECK(relative_error(g.b.to_vector<float>(), cpu.b.to_vector<float>()) <= 1e-5);
    CHECK(relative_error(g.dense.to_vector<float>(), cpu.dense.to_vector<float>()) <= 1e-5);
    CHECK(relative_error(g.dense_b.to_vector<float>(), cpu.dense_b.to_vector<float>()) <= 1e-5);
  }
}

}  // namespace

}  // namespace PMAPCC_TEST_FILE
