// pmap_mlp: computing inside pmap with pmapcc's ops (pmapcc/core/ops.h) and grad (pmapcc/core/grad.h). A
// two-layer MLP learns a fixed "teacher" function by synchronous data-parallel SGD: every device takes its
// block of the batch, computes the loss and its gradients with pmap::value_and_grad, averages the gradients
// with pmean and updates its replica of the parameters. The same code
// runs on CPU devices and, with --backend cuda, on GPUs (the ops then queue on each device's CUDA stream).
// Equal blocks make the averaged gradient the whole batch's, so any device count trains the same model (to
// rounding); the same seed and device count give the same bits run after run on CPU devices.
//
//   pmap_mlp [--backend cpu|cuda] [--devices N] [--steps S] [--batch B] [--hidden H] [--lr LR] [--seed K]
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include <pmap/pmap.h>
#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>

namespace ops = pmap::ops;
using pmap::Array;

struct Mlp {
  Array w1, b1, w2, b2;  // (D, H), (H), (H, 1), (1)
};
PMAPCC_TREE(Mlp, w1, b1, w2, b2)

namespace {

Array normal(pmap::Key key, pmap::Shape shape, float stddev) {
  Array a(std::move(shape), pmap::DType::f32);
  pmap::normal(key, a, 0.0f, stddev);
  return a;
}

// The MSE of the MLP (ReLU hidden layer) on a block (x, y).
Array loss_fn(const Mlp& p, const Array& x, const Array& y) {
  Array h = ops::linear(x, p.w1, p.b1, /*relu=*/true);  // (N, H)
  Array out = ops::linear(h, p.w2, p.b2);               // (N, 1)
  return ops::mean(ops::square(ops::subtract(out, y)));
}

// One device's step on its block (x, y): returns the batch's loss; leaves the replica updated with the
// gradients averaged over the "data" axis.
float train_step(Mlp& p, const Array& x, const Array& y, float lr) {
  auto [loss, grad] = pmap::value_and_grad(loss_fn, "loss_fn")(p, x, y);
  pmap::pmean_inplace(grad, "data");  // the whole batch's gradient on every device
  for (auto [param, g] : {std::pair{&p.w1, &grad.w1}, {&p.b1, &grad.b1}, {&p.w2, &grad.w2}, {&p.b2, &grad.b2}}) {
    *param = ops::subtract(*param, ops::scale(*g, lr));
  }
  return pmap::pmean(loss, "data").item<float>();
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "cpu";
  int devices = 4, steps = 300, batch = 256, hidden = 32, inputs = 8;
  float lr = 0.05f;
  std::uint64_t seed = 0;
  CLI::App app{"pmap_mlp: data-parallel training of a small MLP with pmapcc's ops inside pmap"};
  app.add_option("--backend", backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--devices", devices, "devices along the data axis")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "SGD steps")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", batch, "global batch (divisible by --devices)")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "hidden units")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "data and initialisation seed");
  CLI11_PARSE(app, argc, argv);
  if (batch % devices != 0) {
    std::cerr << "pmap_mlp: --batch " << batch << " is not divisible by --devices " << devices << "\n";
    return 2;
  }
  try {
    pmap::Mesh mesh(pmap::local_devices(pmap::parse_device_kind(backend), devices), "data");
    std::cout << mesh.str() << "\n";
    const auto keys = pmap::split(pmap::key(seed), 6);
    // The teacher: y = tanh(x t1) t2 on a fixed pool of inputs; a new batch is drawn from it every step.
    const int pool = batch * 8;
    Array xs = normal(keys[0], {pool, inputs}, 1.0f);
    Array ys = ops::matmul(ops::tanh(ops::matmul(xs, normal(keys[1], {inputs, 16}, 0.7f))),
                           normal(keys[2], {16, 1}, 0.7f));
    Mlp init{normal(keys[3], {inputs, hidden}, std::sqrt(2.0f / inputs)), Array({hidden}, pmap::DType::f32),
             normal(keys[4], {hidden, 1}, std::sqrt(1.0f / hidden)), Array({1}, pmap::DType::f32)};
    pmap::Sharded<Mlp> params = pmap::replicate(init, mesh);
    auto step = pmap::pmap(train_step, mesh, "data");
    const auto order = pmap::permutation(keys[5], static_cast<std::uint32_t>(pool));
    std::vector<float> xb(static_cast<std::size_t>(batch) * inputs), yb(static_cast<std::size_t>(batch));
    const auto xv = xs.to_vector<float>(), yv = ys.to_vector<float>();
    // What predicting the mean would score: the loss to beat.
    const float baseline = ops::mean(ops::square(ops::subtract(ys, ops::mean(ys)))).item<float>();
    std::printf("%d examples, %d inputs; the targets' variance %.6f\n", pool, inputs, static_cast<double>(baseline));
    float first = 0.0f, last = 0.0f;
    for (int s = 0; s < steps; ++s) {
      for (int r = 0; r < batch; ++r) {  // rows of the pool in a fixed shuffled order, cycled
        const std::size_t at = order[static_cast<std::size_t>((s * batch + r) % pool)];
        for (int c = 0; c < inputs; ++c) xb[static_cast<std::size_t>(r) * inputs + c] = xv[at * inputs + c];
        yb[static_cast<std::size_t>(r)] = yv[at];
      }
      auto x = pmap::shard(Array::from_host(xb, {batch, inputs}), mesh);
      auto y = pmap::shard(Array::from_host(yb, {batch, 1}), mesh);
      last = step(params, x, y, lr)[0];
      if (s == 0) first = last;
      if (s % 50 == 0 || s == steps - 1) std::printf("step %4d  loss %.6f\n", s, static_cast<double>(last));
    }
    std::printf("final loss %.9g (first %.9g)\n", static_cast<double>(last), static_cast<double>(first));
  } catch (const pmap::Error& e) {
    std::cerr << "pmap_mlp: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
