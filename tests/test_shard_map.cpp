// pmap::shard_map (include/pmap/shard_map.h): blocks in by in_specs, assembled by out_specs, the check of the
// promise an unnamed axis makes, grad inside the body (a Megatron MLP on 1x1 to 2x2 meshes), grad of a function
// that calls it (the same MLP as the body; values the same along an axis, psum, pmean, all_gather), a training
// loop on the devices' blocks, and the errors that name the argument, the leaf, the dimension and the axis. On CPU
// devices and on four virtual CUDA devices (the stand-in's, or a GPU's).
#include "cuda_testing.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/vmap.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::random_floats;
using cuda_testing::relative_error;
using pmap::Array;
using pmap::P;
namespace ops = pmap::ops;

// A data x model mesh over the first data * model of `devices`.
pmap::Mesh mesh_of(const std::vector<pmap::Device>& devices, int data, int model) {
  return pmap::Mesh(std::vector<pmap::Device>(devices.begin(), devices.begin() + data * model),
                    {{"data", data}, {"model", model}});
}

std::vector<pmap::Device> cpu_devices() { return pmap::local_devices(pmap::DeviceKind::cpu, 4); }
std::vector<pmap::Device> virtual_cuda_devices() {  // 4 virtual devices on GPU 0
  std::vector<pmap::Device> devices;
  for (int i = 0; i < 4; ++i) devices.push_back(pmap::Device{pmap::DeviceKind::cuda, i, 0});
  return devices;
}

// a (r, k) times b (k, c), columns [k0, k1) of a and rows [k0, k1) of b only, in double.
std::vector<float> host_matmul(const std::vector<float>& a, const std::vector<float>& b, std::int64_t r,
                               std::int64_t k, std::int64_t c, std::int64_t k0, std::int64_t k1) {
  std::vector<float> out(static_cast<std::size_t>(r * c));
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) {
      double s = 0;
      for (std::int64_t q = k0; q < k1; ++q)
        s += double(a[static_cast<std::size_t>(i * k + q)]) * double(b[static_cast<std::size_t>(q * c + j)]);
      out[static_cast<std::size_t>(i * c + j)] = static_cast<float>(s);
    }
  return out;
}

void check_matmul(const std::vector<pmap::Device>& devices) {
  const std::int64_t rows = 12, k = 12, cols = 5;
  const auto xs = random_floats(static_cast<std::size_t>(rows * k), 1);
  const auto ws = random_floats(static_cast<std::size_t>(k * cols), 2);
  const auto want = host_matmul(xs, ws, rows, k, cols, 0, k);
  for (auto mesh_shape : {std::pair{1, 1}, {1, 2}, {2, 1}, {2, 2}, {1, 3}, {3, 1}, {1, 4}, {4, 1}}) {
    const int data = mesh_shape.first, model = mesh_shape.second;  // not a structured binding: lambdas capture it
    CAPTURE(data);
    CAPTURE(model);
    pmap::Mesh mesh = mesh_of(devices, data, model);
    // x's rows over "data" and its K over "model"; w's K over "model": partial products summed over "model".
    auto matmul = pmap::shard_map([&](const Array& x, const Array& w) {
      CHECK(x.shape() == pmap::Shape{rows / data, k / model});
      CHECK(w.shape() == pmap::Shape{k / model, cols});
      return pmap::psum(ops::matmul(x, w), "model");
    }, mesh, {P("data", "model"), P("model", pmap::none)}, P("data", pmap::none));
    const Array y = matmul(Array::from_host(xs, {rows, k}), Array::from_host(ws, {k, cols}));
    CHECK(y.device().is_cpu());
    CHECK(y.shape() == pmap::Shape{rows, cols});
    CHECK(relative_error(y.to_vector<float>(), want) <= 1e-5);

    // sharded(): the blocks, knowing their specs; a second shard_map takes them as they are.
    auto blocks = matmul.sharded(Array::from_host(xs, {rows, k}), Array::from_host(ws, {k, cols}));
    REQUIRE(blocks.size() == static_cast<std::size_t>(data * model));
    REQUIRE(blocks.specs().size() == 1);
    CHECK(blocks.specs()[0].spec == P("data", pmap::none));
    CHECK(blocks[0].device() == mesh.local_devices()[0]);
    auto doubled = pmap::shard_map([](const Array& yd) { return ops::scale(yd, 2.0f); }, mesh, {P("data")},
                                   P("data"));
    const auto twice = doubled(blocks).to_vector<float>();
    const auto once = y.to_vector<float>();
    REQUIRE(twice.size() == once.size());
    for (std::size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == 2.0f * once[i]);
  }
}

TEST_CASE("shard_map: a matmul split over 'data' and 'model' is x w on every mesh of 1-4 CPU devices") {
  check_matmul(cpu_devices());
}

TEST_CASE("cuda shard_map: a matmul split over 'data' and 'model' on four virtual CUDA devices") {
  PMAPCC_REQUIRE_GPU();
  check_matmul(virtual_cuda_devices());
}

TEST_CASE("shard_map: an axis the out spec does not name must hold equal blocks (the check), bit for bit") {
  const std::int64_t rows = 4, k = 6, cols = 3;
  const auto xs = random_floats(static_cast<std::size_t>(rows * k), 3);
  const auto ws = random_floats(static_cast<std::size_t>(k * cols), 4);
  pmap::Mesh mesh = mesh_of(cpu_devices(), 2, 2);
  const Array x = Array::from_host(xs, {rows, k}), w = Array::from_host(ws, {k, cols});
  // The psum forgotten: each "model" device holds its partial product, so the output is not equal along "model".
  auto partial = [](const Array& xd, const Array& wd) { return ops::matmul(xd, wd); };
  const std::vector<pmap::TreeSpec> in{P("data", "model"), P("model", pmap::none)};
  CHECK_THROWS_WITH_AS(pmap::shard_map(partial, mesh, in, P("data", pmap::none))(x, w),
                       doctest::Contains("shard_map: output f32(2, 3) (out spec P('data', None)) differs "
                                         "between cpu:0 (data 0, model 0) and cpu:1 (data 0, model 1), which hold the "
                                         "same block: the spec does not name 'model'"),
                       pmap::ValueError);
  // Unchecked, the first device holding each block is read: model 0's partial product over K's first half.
  const Array y = pmap::shard_map(partial, mesh, in, P("data", pmap::none), {.check = false})(x, w);
  CHECK(relative_error(y.to_vector<float>(), host_matmul(xs, ws, rows, k, cols, 0, k / 2)) <= 1e-5);
  // Naming "model" keeps every partial product: (rows, cols * 2), model m's in columns [m cols, (m+1) cols).
  const Array both = pmap::shard_map(partial, mesh, in, P("data", "model"))(x, w);
  CHECK(both.shape() == pmap::Shape{rows, 2 * cols});
  const auto b = both.to_vector<float>();
  for (int m = 0; m < 2; ++m) {
    const auto part = host_matmul(xs, ws, rows, k, cols, m * k / 2, (m + 1) * k / 2);
    std::vector<float> got;
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) got.push_back(b[static_cast<std::size_t>(i * 2 * cols + m * cols + j)]);
    CHECK(relative_error(got, part) <= 1e-5);
  }
  // A replicated output (P()) must agree across every axis: a pmean over "data" alone is not enough.
  auto mean_over = [&](pmap::AxisNames axes) {
    return pmap::shard_map([axes](const Array& xd) { return pmap::pmean(ops::sum(xd), axes); }, mesh,
                           {P("data", "model")}, P());
  };
  CHECK_THROWS_WITH_AS(mean_over("data")(x), doctest::Contains("the spec does not name 'model'"), pmap::ValueError);
  auto last_differs = [](const Array& xd) {  // equal on cpu:0-2; cpu:3 differs from cpu:0 along both axes
    const bool last = pmap::axis_index("data") == 1 && pmap::axis_index("model") == 1;
    return ops::scale(ops::sum(xd), 0.0f, last ? 1.0f : 0.0f);
  };
  CHECK_THROWS_WITH_AS(pmap::shard_map(last_differs, mesh, {P("data", "model")}, P())(x),
                       doctest::Contains("the spec does not name 'data', 'model', a promise that the output is equal "
                                         "along them"),
                       pmap::ValueError);
  CHECK(std::abs(mean_over(pmap::AxisNames{"data", "model"})(x).item<float>() -
                 [&] { double s = 0; for (float v : xs) s += v; return float(s / 4); }()) <= 1e-5f);
  // Scalar leaves have no spec: they must be equal everywhere.
  auto with_index = [](const Array& xd) { return std::pair(ops::scale(xd, 1.0f), pmap::axis_index("model")); };
  auto scalar = pmap::shard_map(with_index, mesh, {P("data", "model")}, P("data", "model"));
  CHECK_THROWS_WITH_AS(scalar(x), doctest::Contains("shard_map: output '1' (a scalar leaf: it has no spec, so it must "
                                                    "be the same on every device) differs between cpu:0"),
                       pmap::ValueError);
  auto [same, index] = pmap::shard_map([](const Array& xd) { return std::pair(ops::scale(xd, 1.0f), 7); }, mesh,
                                       {P("data", "model")}, P("data", "model"))(x);
  CHECK(same.to_vector<float>() == xs);
  CHECK(index == 7);
}

// y = relu(x w1 + b1) w2 + b2, loss = mean((y - t)^2); w1's columns and w2's rows over "model" (Megatron's
// column- then row-parallel pair, one psum), the rows of x and t over "data".
struct Mlp {
  Array w1, b1, w2, b2;
};
PMAPCC_TREE(Mlp, w1, b1, w2, b2)

Array mlp_loss(const Mlp& p, const Array& x, const Array& t, bool split) {
  Array partial = ops::matmul(ops::linear(x, p.w1, p.b1, true), p.w2);
  Array y = ops::add(split ? pmap::psum(partial, "model") : std::move(partial), p.b2);
  return ops::mean(ops::square(ops::subtract(y, t)));
}

const pmap::Specs mlp_specs{{"w1", P(pmap::none, "model")}, {"b1", P("model")}, {"w2", P("model", pmap::none)}};

Mlp sgd(const Mlp& p, const Mlp& g, float lr) {
  auto step = [&](const Array& a, const Array& b) { return ops::subtract(a, ops::scale(b, lr)); };
  return {step(p.w1, g.w1), step(p.b1, g.b1), step(p.w2, g.w2), step(p.b2, g.b2)};
}

std::vector<float> values(const Array& a) { return a.to_vector<float>(); }

// The MLP's parameters (4 inputs, 12 hidden, 3 outputs), 8 rows of inputs x and targets t.
struct MlpProblem {
  static Array host(std::int64_t n, std::uint32_t seed, pmap::Shape shape) {
    return Array::from_host(random_floats(static_cast<std::size_t>(n), seed), std::move(shape));
  }
  static constexpr std::int64_t rows = 8, in = 4, hidden = 12, out = 3;
  const Mlp full{host(in * hidden, 9, {in, hidden}), host(hidden, 10, {hidden}), host(hidden * out, 11, {hidden, out}),
                 host(out, 12, {out})};
  const Array x = host(rows * in, 7, {rows, in}), t = host(rows * out, 8, {rows, out});
};

TEST_CASE("shard_map with grad inside: a Megatron MLP gives the unsplit model's gradients on 1x1, 1x2, 2x2, 1x4") {
  const MlpProblem problem;
  const Mlp& full = problem.full;
  const Array &x = problem.x, &t = problem.t;
  auto unsplit = [&](const Mlp& p) { return pmap::grad([&](const Mlp& q) { return mlp_loss(q, x, t, false); })(p); };
  const Mlp g = unsplit(full);
  // Three SGD steps of the unsplit model.
  Mlp trained = sgd(full, g, 0.1f);
  for (int s = 1; s < 3; ++s) trained = sgd(trained, unsplit(trained), 0.1f);

  for (auto mesh_shape : {std::pair{1, 1}, {1, 2}, {2, 2}, {1, 4}}) {
    const int data = mesh_shape.first, model = mesh_shape.second;  // not a structured binding: lambdas capture it
    CAPTURE(data);
    CAPTURE(model);
    pmap::Mesh mesh = mesh_of(cpu_devices(), data, model);
    auto grads_of = [](const Mlp& p, const Array& xd, const Array& td) {
      // Each "data" device's mean over its rows; the pmean over "data" is the whole batch's.
      return pmap::pmean(pmap::grad([&](const Mlp& q) { return mlp_loss(q, xd, td, true); }, "mlp_loss")(p), "data");
    };
    const std::vector<pmap::TreeSpec> in_specs{mlp_specs, P("data"), P("data")};
    // The check holds the promises: b2's gradient equal along "model" (psum's transpose), every one along "data".
    const Mlp gs = pmap::shard_map(grads_of, mesh, in_specs, mlp_specs)(full, x, t);
    CHECK(relative_error(values(gs.w1), values(g.w1)) <= 1e-5);
    CHECK(relative_error(values(gs.b1), values(g.b1)) <= 1e-5);
    CHECK(relative_error(values(gs.w2), values(g.w2)) <= 1e-5);
    CHECK(relative_error(values(gs.b2), values(g.b2)) <= 1e-5);
    // Without the pmean over "data" the gradients differ along it: the check names the axis.
    if (data > 1) {
      auto local = [](const Mlp& p, const Array& xd, const Array& td) {
        return pmap::grad([&](const Mlp& q) { return mlp_loss(q, xd, td, true); })(p);
      };
      CHECK_THROWS_WITH_AS(pmap::shard_map(local, mesh, in_specs, mlp_specs)(full, x, t),
                           doctest::Contains("the spec does not name 'data'"), pmap::ValueError);
    }
    // A training loop on the devices' blocks: each step's result fed to the next as it is.
    auto step = pmap::shard_map([&](const Mlp& p, const Array& xd, const Array& td) {
      return sgd(p, grads_of(p, xd, td), 0.1f);
    }, mesh, in_specs, mlp_specs);
    pmap::Sharded<Mlp> p = pmap::shard(full, mesh, mlp_specs);
    for (int s = 0; s < 3; ++s) p = step.sharded(p, x, t);
    const Mlp after = pmap::unshard(p, mesh);
    CHECK(relative_error(values(after.w1), values(trained.w1)) <= 1e-5);
    CHECK(relative_error(values(after.b1), values(trained.b1)) <= 1e-5);
    CHECK(relative_error(values(after.w2), values(trained.w2)) <= 1e-5);
    CHECK(relative_error(values(after.b2), values(trained.b2)) <= 1e-5);
  }
}

// No pmean in the body: the weights replicated over "data" meet each device's rows, so the backward pass sums
// their cotangents over "data" (JAX's implicit pvary, transposed); b2, replicated over both axes and added after
// the psum, varies along "data" only.
void check_grad_of_megatron(const std::vector<pmap::Device>& devices) {
  const MlpProblem problem;
  const Mlp& full = problem.full;
  const Array &x = problem.x, &t = problem.t;
  auto [want_loss, want] = pmap::value_and_grad<0, 1>([&](const Mlp& p, const Array& xs) {
    return mlp_loss(p, xs, t, false);
  })(full, x);
  const auto& [g, gx] = want;
  for (auto mesh_shape : {std::pair{1, 1}, {1, 2}, {2, 2}, {1, 4}, {4, 1}}) {
    const int data = mesh_shape.first, model = mesh_shape.second;  // not a structured binding: lambdas capture it
    CAPTURE(data);
    CAPTURE(model);
    pmap::Mesh mesh = mesh_of(devices, data, model);
    auto forward = [](const Mlp& p, const Array& xd) {
      Array partial = ops::matmul(ops::linear(xd, p.w1, p.b1, true), p.w2);
      return ops::add(pmap::psum(partial, "model"), p.b2);
    };
    auto loss = [&](const Mlp& p, const Array& xs) {
      const Array y = pmap::shard_map(forward, mesh, {mlp_specs, P("data")}, P("data"))(p, xs);
      return ops::mean(ops::square(ops::subtract(y, t)));
    };
    auto [value, grads] = pmap::value_and_grad<0, 1>(loss)(full, x);
    const auto& [gs, gxs] = grads;
    CHECK(std::abs(value.item<float>() - want_loss.item<float>()) <= 1e-6f * std::abs(want_loss.item<float>()));
    CHECK(relative_error(values(gs.w1), values(g.w1)) <= 1e-5);
    CHECK(relative_error(values(gs.b1), values(g.b1)) <= 1e-5);
    CHECK(relative_error(values(gs.w2), values(g.w2)) <= 1e-5);
    CHECK(relative_error(values(gs.b2), values(g.b2)) <= 1e-5);
    CHECK(relative_error(values(gxs), values(gx)) <= 1e-5);
    // The same bits again.
    auto [again_value, again] = pmap::value_and_grad<0, 1>(loss)(full, x);
    CHECK(values(std::get<0>(again).w1) == values(gs.w1));
    CHECK(values(std::get<1>(again)) == values(gxs));
    // Three SGD steps through the shard_map: the unsplit model's.
    Mlp p = sgd(full, gs, 0.1f), q = sgd(full, g, 0.1f);
    for (int s = 1; s < 3; ++s) {
      p = sgd(p, pmap::grad([&](const Mlp& m) { return loss(m, x); })(p), 0.1f);
      q = sgd(q, pmap::grad([&](const Mlp& m) { return mlp_loss(m, x, t, false); })(q), 0.1f);
    }
    CHECK(relative_error(values(p.w1), values(q.w1)) <= 1e-5);
    CHECK(relative_error(values(p.w2), values(q.w2)) <= 1e-5);
  }
}

TEST_CASE("grad of a function that calls shard_map: the Megatron MLP's forward as the body, the loss outside") {
  check_grad_of_megatron(cpu_devices());
}

TEST_CASE("cuda grad of a function that calls shard_map: the Megatron MLP on four virtual CUDA devices") {
  PMAPCC_REQUIRE_GPU();
  check_grad_of_megatron(virtual_cuda_devices());
}

TEST_CASE("grad of a function that calls shard_map: values the same along an axis, psum, all_gather, copies out") {
  pmap::Mesh mesh = mesh_of(cpu_devices(), 2, 2);
  const auto xs = random_floats(24, 21), ws = random_floats(24, 22);
  const Array x = Array::from_host(xs, {4, 6});
  const Array w = Array::from_host(ws, {4, 6});
  auto weighted = [&](const Array& y) { return ops::sum(ops::multiply(y, w)); };  // d/dy = w
  auto grad_of = [&](auto body, const P& in, const P& out) {
    return pmap::grad([&](const Array& a) { return weighted(pmap::shard_map(body, mesh, {in}, out)(a)); })(x)
        .template to_vector<float>();
  };
  auto times = [](const std::vector<float>& v, float k) {
    std::vector<float> out;
    for (float e : v) out.push_back(e * k);
    return out;
  };
  // Replicated in and out, computed alike on every device: the gradient once, not once per device.
  CHECK(grad_of([](const Array& a) { return ops::scale(a, 2.0f); }, P(), P()) == times(ws, 2.0f));
  // A psum over "model" of a value the same on its devices is 2 x: its gradient is 2 w.
  CHECK(grad_of([](const Array& a) { return pmap::psum(a, "model"); }, P(), P()) == times(ws, 2.0f));
  // Rows over "data", gathered back whole (all_gather's result is the same on every device): x itself.
  CHECK(grad_of([](const Array& a) { return pmap::all_gather(a, "data", 0, true); }, P("data"), P()) == ws);
  // pmean over "model" of column blocks: their mean, the same on both; each block's gradient is half of it.
  auto mean_cols = [](const Array& a) { return pmap::pmean(a, "model"); };
  const Array y = pmap::shard_map(mean_cols, mesh, {P(pmap::none, "model")}, P())(x);
  CHECK(y.shape() == pmap::Shape{4, 3});
  const Array w3 = Array::from_host(random_floats(12, 23), {4, 3});
  const std::vector<float> g3 =
      pmap::grad([&](const Array& a) {
        return ops::sum(ops::multiply(pmap::shard_map(mean_cols, mesh, {P(pmap::none, "model")}, P())(a), w3));
      })(x).to_vector<float>();
  const std::vector<float> w3s = w3.to_vector<float>();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c)
      CHECK(g3[static_cast<std::size_t>(r * 6 + c)] == w3s[static_cast<std::size_t>(r * 3 + c % 3)] / 2.0f);
  // A value the same on every device, assembled as blocks along "data" (two copies): each copy's cotangent.
  std::vector<float> both(24);
  const Array w8 = Array::from_host(random_floats(48, 24), {8, 6});
  const std::vector<float> w8s = w8.to_vector<float>();
  for (std::size_t i = 0; i < 24; ++i) both[i] = w8s[i] + w8s[i + 24];
  CHECK(pmap::grad([&](const Array& a) {
          return ops::sum(ops::multiply(pmap::shard_map([](const Array& b) { return ops::scale(b, 1.0f); }, mesh, {P()},
                                                        P("data"))(a), w8));
        })(x).to_vector<float>() == both);
  // Two outputs, one split over "data" and one the same everywhere (a psum): each cotangent counts once.
  auto two_outputs = [](const Array& b) {
    return std::pair{ops::scale(b, 1.0f), pmap::psum(ops::sum(b), "data")};
  };
  const std::vector<float> g2 = pmap::grad([&](const Array& a) {
    auto [y2, total] = pmap::shard_map(two_outputs, mesh, {P("data")}, pmap::Specs{{"0", P("data")}})(a);
    return ops::add(weighted(y2), ops::scale(total, 3.0f));
  })(x).to_vector<float>();
  std::vector<float> w_plus_3;
  for (float e : ws) w_plus_3.push_back(e + 3.0f);
  CHECK(g2 == w_plus_3);
  // pvary: of a block already split over "model", the identity; of a replicated value, copies whose cotangents
  // are summed.
  CHECK(grad_of([](const Array& a) { return pmap::pvary(a, "model"); }, P(pmap::none, "model"),
                P(pmap::none, "model")) == ws);
  CHECK(pmap::grad([&](const Array& a) {
          return ops::sum(ops::multiply(
              pmap::shard_map([](const Array& b) { return pmap::pvary(b, "data"); }, mesh, {P()}, P("data"))(a), w8));
        })(x).to_vector<float>() == both);
  // An integer leaf split over "data" (labels): the values computed from it vary along "data", so a replicated
  // weight gets every device's part.
  const Array logits = Array::from_host(random_floats(6, 25), {2, 3});
  const Array labels = Array::from_host(std::vector<std::int32_t>{2, 0, 1, 1}, {4});
  auto per_device_loss = [](const Array& l, const Array& lab) {
    return ops::reshape(ops::softmax_cross_entropy(l, lab), {1});
  };
  const Array g_logits = pmap::grad([&](const Array& l) {
    return ops::sum(pmap::shard_map(per_device_loss, mesh, {P(), P("data")}, P("data"))(l, labels));
  })(logits);
  auto part = [&](std::vector<std::int32_t> rows) {
    const Array lab = Array::from_host(rows, {2});
    return pmap::grad([&](const Array& l) { return ops::softmax_cross_entropy(l, lab); })(logits);
  };
  CHECK(g_logits.to_vector<float>() == ops::add(part({2, 0}), part({1, 1})).to_vector<float>());
  // An output that varies along an axis its out spec does not name (a ppermute of equal values passes the
  // value check): refused under grad, as JAX's check_vma.
  CHECK_THROWS_WITH_AS(pmap::grad([&](const Array& a) {
                         return weighted(pmap::shard_map([](const Array& b) {
                           return pmap::ppermute(b, "model", {{0, 1}, {1, 0}});
                         }, mesh, {P()}, P())(a));
                       })(x),
                       doctest::Contains("shard_map: output leaf 0 f32(4, 6) varies along 'model'"), pmap::ValueError);
  // vmap inside the body: pvary of each row (its tracked VJP batched element-wise) as pvary of the block;
  // all_gather of each row, whose tracked VJP is not batched yet, refused naming it.
  CHECK(pmap::grad([&](const Array& a) {
          return ops::sum(ops::multiply(pmap::shard_map([](const Array& b) {
            return pmap::vmap([](const Array& r) { return pmap::pvary(r, "data"); }, {}, "rows")(b);
          }, mesh, {P()}, P("data"))(a), w8));
        })(x).to_vector<float>() == both);
  CHECK_THROWS_WITH_AS(pmap::grad([&](const Array& a) {
                         return weighted(pmap::shard_map([](const Array& b) {
                           return pmap::vmap([](const Array& r) { return pmap::all_gather(r, "data", 0, true); },
                                             {}, "rows")(b);
                         }, mesh, {P(pmap::none, "data")}, P())(a));
                       })(x),
                       doctest::Contains("all_gather under vmap in its body is not supported yet"),
                       pmap::NotAvailable);
  // A tree in and out with a scalar leaf out (the first device's), and a leaf nothing flows to.
  std::map<std::string, Array> tree;
  tree.emplace("a", x.copy());
  tree.emplace("unused", w.copy());
  auto f = [](const std::map<std::string, Array>& m) {
    return std::pair{ops::scale(m.at("a"), 3.0f), pmap::axis_size("data")};
  };
  const auto g = pmap::grad([&](const std::map<std::string, Array>& m) {
    auto [y2, index] = pmap::shard_map(f, mesh, {pmap::Specs{{"a", P("data")}}}, P("data"))(m);
    CHECK(index == 2);
    return weighted(y2);
  })(tree);
  CHECK(g.at("a").to_vector<float>() == times(ws, 3.0f));
  CHECK(g.at("unused").to_vector<float>() == std::vector<float>(24, 0.0f));
}

TEST_CASE("shard_map: bad specs and arguments raise naming the argument, the leaf, the dimension and the axis") {
  pmap::Mesh mesh = mesh_of(cpu_devices(), 2, 2);
  const Array x = Array::from_host(random_floats(24, 5), {4, 6});
  auto id = [](const Array& a) { return ops::scale(a, 1.0f); };
  auto two = [](const Array& a, const Array&) { return ops::scale(a, 1.0f); };
  // vmap of a function that calls shard_map, and sharded() of values grad traces: refused, naming the leaf.
  auto w_only = [](const std::map<std::string, Array>& m) { return ops::scale(m.at("w"), 1.0f); };
  std::map<std::string, Array> params;
  params.emplace("b", Array::from_host(random_floats(2, 6), {2}));
  params.emplace("w", x.copy());
  const Array stacked = Array::from_host(random_floats(48, 5), {2, 4, 6});
  CHECK_THROWS_WITH_AS(pmap::vmap([&](const Array& a) { return pmap::shard_map(id, mesh, {P("data")}, P("data"))(a); })(
                           stacked),
                       "shard_map: argument 0 is a value that vmap traces: vmap of a function that calls shard_map is "
                       "not supported (f's blocks would be copies vmap does not follow); vmap inside f, or stack the "
                       "members along an axis the specs split",
                       pmap::NotAvailable);
  auto blocks_of = [&](const std::map<std::string, Array>& p) {
    auto blocks = pmap::shard_map(w_only, mesh, {pmap::Specs{{"w", P("data")}}}, P("data")).sharded(p);
    return ops::sum(pmap::unshard(blocks, mesh));
  };
  CHECK_THROWS_WITH_AS(pmap::grad(blocks_of)(params),
                       "shard_map: argument 0, leaf 'b', is a value that grad traces, given to sharded() or beside a "
                       "Sharded argument: its blocks would be copies the gradient does not follow; call "
                       "shard_map(...)(args) with whole trees, whose result is whole and differentiable",
                       pmap::NotAvailable);
  CHECK_THROWS_WITH_AS(pmap::shard_map(two, mesh, {P("data")}, P("data"))(x, x),
                       "shard_map: in_specs has 1 entries, but f is called with 2 argument(s); give one (a P, or "
                       "Specs by leaf path) per argument",
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::shard_map(two, mesh, {P("data"), P(pmap::none, "rows")}, P("data"))(x, x),
                       "shard_map: argument 1: the array f32(4, 6): dimension 1 of spec P(None, 'rows') names axis "
                       "'rows', which Mesh(data=2, model=2; cpu:0..cpu:3) does not have",
                       pmap::AxisError);
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, mesh, {P("data", "data")}, P("data"))(x),
                       doctest::Contains("shard_map: argument 0: the array f32(4, 6): spec P('data', 'data') names "
                                         "axis 'data' twice"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, mesh, {P("data", pmap::none, "model")}, P("data"))(x),
                       doctest::Contains("shard_map: argument 0: the array f32(4, 6) has 2 dimension(s), but its "
                                         "spec P('data', None, 'model') gives 3"),
                       pmap::ShapeError);
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, mesh, {P(pmap::AxisNames{"data", "model"}, "model")}, P("data"))(
                           Array::from_host(random_floats(12, 5), {4, 3})),
                       doctest::Contains("the array f32(4, 3): spec P(('data', 'model'), 'model') names axis 'model' "
                                         "twice"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, mesh, {P(pmap::none, pmap::AxisNames{"data", "model"})}, P())(x),
                       doctest::Contains("shard_map: argument 0: the array f32(4, 6): dimension 1 (size 6) does not "
                                         "split evenly over ('data', 'model') (4 devices)"),
                       pmap::ShapeError);
  const std::map<std::string, Array> tree = [&] {
    std::map<std::string, Array> m;
    m.emplace("a", Array::from_host(random_floats(8, 6), {4, 2}));
    return m;
  }();
  auto first = [](const std::map<std::string, Array>& m) { return ops::scale(m.at("a"), 1.0f); };
  CHECK_THROWS_WITH_AS(pmap::shard_map(first, mesh, {pmap::Specs{{"b", P("data")}}}, P("data"))(tree),
                       "shard_map: argument 0: the specs name 'b' (P('data')), which is not an array leaf of the tree "
                       "(its array leaves: 'a')",
                       pmap::ValueError);
  // Out specs: an axis the mesh lacks, a path that is no leaf, blocks of different shapes.
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, mesh, {P("data")}, P("batch"))(x),
                       doctest::Contains("shard_map: output: the array f32(2, 6) (a block): dimension 0 of spec "
                                         "P('batch') names axis 'batch'"),
                       pmap::AxisError);
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, mesh, {P("data")}, pmap::Specs{{"y", P("data")}})(x),
                       "shard_map: out_specs: the specs name 'y' (P('data')), which is not an array leaf of the tree "
                       "(its array leaves: the array)",
                       pmap::ValueError);
  auto ragged = [](const Array& a) {
    return pmap::axis_index("model") == 0 ? ops::scale(a, 1.0f) : ops::slice(a, {0, 0}, {1, 6});
  };
  CHECK_THROWS_WITH_AS(pmap::shard_map(ragged, mesh, {P("data")}, P("data", "model"))(x),
                       "shard_map: output: cpu:1 (data 0, model 1)'s block is f32(1, 6), cpu:0 (data 0, "
                       "model 0)'s f32(2, 6); every device's block of an output has one shape and dtype",
                       pmap::ShapeError);
  auto keyed = [](const Array& a) {  // a tree whose key depends on the device
    std::map<std::string, Array> out;
    out.emplace(pmap::axis_index("model") == 0 ? "a" : "b", ops::scale(a, 1.0f));
    return out;
  };
  CHECK_THROWS_WITH_AS(pmap::shard_map(keyed, mesh, {P("data")}, P("data", "model"))(x),
                       "shard_map: cpu:1 (data 0, model 1) returned a tree of 1 arrays and 0 scalars, not the leaves "
                       "of cpu:0 (data 0, model 0)'s (1 arrays and 0 scalars)",
                       pmap::ShapeError);
  // Sharded arguments: split otherwise, carrying no specs, or for another mesh.
  auto by_rows = pmap::shard(x, mesh, P("data"));
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, mesh, {P(pmap::none, "data")}, P())(by_rows),
                       "shard_map: argument 0: the array is split by P('data'), but in_specs give P(None, 'data'); "
                       "reshard it (unshard, then shard) or change the in spec",
                       pmap::ValueError);
  CHECK(pmap::shard_map(id, mesh, {P("data", pmap::none)}, P("data"))(by_rows).to_vector<float>() ==
        x.to_vector<float>());  // P('data') and P('data', None) split alike
  auto replicated = pmap::replicate(x, mesh);
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, mesh, {P()}, P())(replicated),
                       doctest::Contains("shard_map: argument 0 is a Sharded value that carries no specs"),
                       pmap::ValueError);
  pmap::Mesh small = mesh_of(cpu_devices(), 1, 2);
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, small, {P("data")}, P("data"))(by_rows),
                       "shard_map: argument 0 is a Sharded value of 4 entries, but the mesh has 2 local devices",
                       pmap::ShapeError);
  pmap::Mesh rows4 = mesh_of(cpu_devices(), 4, 1);  // the same devices, other axes: blocks of another size
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, rows4, {P("data")}, P("data"))(by_rows),
                       "shard_map: argument 0 was split on Mesh(data=2, model=2; cpu:0, cpu:1, cpu:2, cpu:3), not on "
                       "this Mesh(data=4, model=1; cpu:0, cpu:1, cpu:2, cpu:3); unshard it there and pass the whole "
                       "tree",
                       pmap::ValueError);
  const auto eight = pmap::local_devices(pmap::DeviceKind::cpu, 8);
  pmap::Mesh others(std::vector<pmap::Device>(eight.begin() + 4, eight.end()), {{"data", 2}, {"model", 2}});
  std::vector<Array> entries;  // made by hand: no mesh recorded, on cpu:0..3
  for (const Array& e : by_rows) entries.push_back(e.copy());
  const pmap::Sharded<Array> by_hand(std::move(entries), by_rows.specs());
  CHECK_THROWS_WITH_AS(pmap::shard_map(id, others, {P("data")}, P("data"))(by_hand),
                       "shard_map: argument 0: entry 0 holds an array on cpu:0, but the mesh's local device 0 is cpu:4",
                       pmap::ValueError);
}

}  // namespace

}  // namespace PMAPCC_TEST_FILE
