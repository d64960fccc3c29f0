// keras_data_parallel: the Keras multi-GPU guide's custom training loop with JAX, in C++: the BatchNorm +
// Dropout convnet as a function of modules called statelessly (trainable variables, non-trainable
// variables: the moving statistics), value_and_grad with has_aux threading the new statistics out,
// the gradients pmean'd over "data", Adam 1e-3 on a global batch of 64 sharded over the devices. The
// keys, the data order, the dropout masks and the arithmetic are mnist_ensemble's
// (--model keras-convnet --mode data-parallel), so the two programs train the same model from one seed.
// --members M trains M such models side by side and also reports their ensemble.
//
//   keras_data_parallel --data data/mnist [--devices D] [--members M] [--epochs E] [--seed S] [--metrics-json F]
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/core/grad.h>
#include <pmapcc/core/jit.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/nn/layers.h>
#include <pmapcc/nn/normalization.h>
#include <pmapcc/optim/adam.h>
#include <pmapcc/train/data.h>

#include "example_flags.h"

namespace ops = pmap::ops;
namespace nn = pmap::nn;
using pmap::Array;

// ---- the convnet: Conv-BN-ReLU x3, GlobalAveragePooling2D, Dense-ReLU, Dropout, Dense ----------------------
struct Params {  // model.trainable_variables
  nn::ConvKernel Conv_0;
  nn::BatchNormCenter BatchNorm_0;
  nn::ConvKernel Conv_1;
  nn::BatchNormCenter BatchNorm_1;
  nn::ConvParams large_k;
  nn::BatchNormCenter BatchNorm_2;
  nn::DenseParams Dense_0, Dense_1;
};
PMAPCC_TREE(Params, Conv_0, BatchNorm_0, Conv_1, BatchNorm_1, large_k, BatchNorm_2, Dense_0, Dense_1)

struct Stats {  // model.non_trainable_variables
  nn::BatchNormState BatchNorm_0, BatchNorm_1, BatchNorm_2;
};
PMAPCC_TREE(Stats, BatchNorm_0, BatchNorm_1, BatchNorm_2)

constexpr auto glorot = nn::Init::glorot_uniform;  // Keras's default initializer
const nn::Conv conv_0{.features = 12, .kernel_init = glorot};
const nn::Conv conv_1{.features = 24, .kernel_h = 6, .kernel_w = 6, .stride_h = 2, .stride_w = 2, .same = false,
                      .kernel_init = glorot};
const nn::Conv large_k{.features = 32, .kernel_h = 6, .kernel_w = 6, .stride_h = 2, .stride_w = 2,
                       .kernel_init = glorot};
const nn::BatchNorm batch_norm{.axis_name = {"data"}};  // center only; the global batch's statistics
const nn::Dense dense_0{.features = 256, .kernel_init = glorot}, dense_1{.features = 10, .kernel_init = glorot};
const nn::Dropout dropout{.rate = 0.5f};

// model.stateless_call(trainable, non_trainable, x, training): x (N, 28, 28, 1) -> (logits (N, 10), new stats).
std::pair<Array, Stats> convnet(const Params& p, const Stats& s, const Array& x, bool training, const nn::Rng& rng) {
  const nn::BatchNormCall call{.train = training, .relu = true};
  auto [h0, s0] = batch_norm(p.BatchNorm_0, s.BatchNorm_0, conv_0(p.Conv_0, x), call);
  auto [h1, s1] = batch_norm(p.BatchNorm_1, s.BatchNorm_1, conv_1(p.Conv_1, h0), call);
  auto [h2, s2] = batch_norm(p.BatchNorm_2, s.BatchNorm_2, large_k(p.large_k, h1), call);
  Array h = dense_0(p.Dense_0, ops::global_avg_pool(h2), /*relu=*/true);
  h = dropout(h, {.train = training, .rng = rng});
  return {dense_1(p.Dense_1, h), Stats{std::move(s0), std::move(s1), std::move(s2)}};
}

// Each tensor t of the model from fold_in(key, t), in the program's order (kernels, then biases and offsets).
Params init_params(pmap::Key key, const pmap::Device& d) {
  auto k = [&](std::uint32_t t) { return pmap::fold_in(key, t); };
  return {conv_0.init_kernel(k(0), 1, d), batch_norm.init_center(12, d), conv_1.init_kernel(k(2), 12, d),
          batch_norm.init_center(24, d),  large_k.init(k(4), 24, d),     batch_norm.init_center(32, d),
          dense_0.init(k(7), 32, d),      dense_1.init(k(9), 256, d)};
}

Stats init_stats(const pmap::Device& d) {
  return {batch_norm.init_state(12, d), batch_norm.init_state(24, d), batch_norm.init_state(32, d)};
}

// ---- the train state and the train step ---------------------------------------------------------------------
struct Member {  // (trainable_variables, non_trainable_variables, optimizer_variables), and the dropout key
  Params params;
  Stats stats;
  pmap::optim::AdamState opt;
  Array dropout_key;  // (2) u32
};
PMAPCC_TREE(Member, params, stats, opt, dropout_key)

// One member's train_step on this device's block of the global batch: the member's new state and the global
// mean loss. Jitted inside pmap (the guide's jax.jit): each device plans the step's buffers once.
std::pair<Member, Array> member_step(const Member& m, const Array& x, const Array& y, const pmap::optim::Adam& tx) {
  const nn::Rng rng{&m.dropout_key, &m.opt.count, std::int64_t{pmap::axis_index("data")} * x.dim(0)};
  auto compute_loss_and_updates = [&](const Params& params, const Stats& stats) {
    auto [logits, new_stats] = convnet(params, stats, x, /*training=*/true, rng);
    return std::make_pair(ops::softmax_cross_entropy(logits, y), std::move(new_stats));
  };
  auto [loss_and_stats, grads] = pmap::value_and_grad(compute_loss_and_updates, "compute_loss_and_updates")(
      m.params, m.stats);
  pmap::pmean_inplace(grads, "data");  // each device's share of the global batch's mean gradient
  auto [updates, opt] = tx.update(grads, m.opt, m.params);
  Member next{pmap::optim::apply_updates(m.params, updates), std::move(loss_and_stats.second), std::move(opt),
              m.dropout_key.copy()};
  return {std::move(next), pmap::pmean(loss_and_stats.first, "data")};
}

template <class Step>
float train_step(std::vector<Member>& members, const Array& x, const Array& y, const Step& step) {
  float loss_sum = 0;
  for (Member& m : members) {
    auto [next, loss] = step(m, x, y);
    m = std::move(next);
    loss_sum += loss.template item<float>();
  }
  return loss_sum;
}

// ---- evaluation: each device predicts its block of a chunk; the members' probabilities averaged ---------------
struct Predicted {
  std::vector<std::vector<std::int32_t>> members;
  std::vector<std::int32_t> ensemble;
};

Predicted predict(const std::vector<Member>& members, const Array& x) {
  Predicted out;
  Array probs;
  for (const Member& m : members) {
    Array p = ops::softmax(convnet(m.params, m.stats, x, /*training=*/false, {}).first);
    out.members.push_back(ops::argmax(p).to_vector<std::int32_t>());
    probs = probs.valid() ? ops::add(probs, p) : std::move(p);
  }
  out.ensemble = ops::argmax(probs).to_vector<std::int32_t>();
  return out;
}

std::pair<std::vector<double>, double> evaluate(const pmap::Sharded<std::vector<Member>>& state,
                                                const pmap::train::Dataset& test, const pmap::Mesh& mesh,
                                                int members) {
  auto run = pmap::pmap(predict, mesh);
  std::vector<double> member_hits(static_cast<std::size_t>(members), 0.0);
  double ensemble_hits = 0;
  const std::int64_t devices = mesh.size(), chunk = 250 * devices;
  for (std::int64_t at = 0; at < test.count; at += chunk) {
    const std::int64_t n = std::min(chunk, test.count - at), padded = (n + devices - 1) / devices * devices;
    std::vector<std::uint32_t> rows(static_cast<std::size_t>(padded), static_cast<std::uint32_t>(at));
    for (std::int64_t i = 0; i < n; ++i) rows[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(at + i);
    std::vector<float> images(static_cast<std::size_t>(padded) * 784);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(padded));
    pmap::train::gather_batch(test, rows, images.data(), labels.data());
    const auto out = run(state, pmap::shard(Array::from_host(images, {padded, 28, 28, 1}), mesh));
    std::size_t row = 0;  // the padding rows (repeats of the chunk's first) are not counted
    for (const Predicted& p : out) {
      for (std::size_t i = 0; i < p.ensemble.size() && row < static_cast<std::size_t>(n); ++i, ++row) {
        for (std::size_t m = 0; m < p.members.size(); ++m) member_hits[m] += p.members[m][i] == labels[row];
        ensemble_hits += p.ensemble[i] == labels[row];
      }
    }
  }
  for (double& h : member_hits) h /= static_cast<double>(test.count);
  return {member_hits, ensemble_hits / static_cast<double>(test.count)};
}

// ---- the epoch loop -----------------------------------------------------------------------------------------
struct Epoch {
  double train_loss = 0, seconds = 0;
};

Epoch train_epoch(pmap::Sharded<std::vector<Member>>& state, const pmap::train::Dataset& train,
                  const examples::Flags& f, pmap::Key key, const pmap::Mesh& mesh, const pmap::optim::Adam& tx) {
  const auto order = pmap::permutation(key, static_cast<std::uint32_t>(train.count));
  const auto steps = pmap::train::steps_per_epoch(train.count, f.batch);
  auto member_jit = pmap::jit([&](const Member& m, const Array& x, const Array& y) { return member_step(m, x, y, tx); },
                              "train_step");
  auto step = pmap::pmap(
      [&](std::vector<Member>& m, const Array& x, const Array& y) { return train_step(m, x, y, member_jit); }, mesh);
  std::vector<float> images(static_cast<std::size_t>(f.batch) * 784);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(f.batch));
  Epoch e;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t s = 0; s < steps; ++s) {
    pmap::train::gather_batch(train, std::span(order).subspan(static_cast<std::size_t>(s * f.batch),
                                                                 static_cast<std::size_t>(f.batch)),
                                 images.data(), labels.data());
    const auto losses = step(state, pmap::shard(Array::from_host(images, {f.batch, 28, 28, 1}), mesh),
                             pmap::shard(Array::from_host(labels, {f.batch}), mesh));
    e.train_loss += losses[0] / f.members;
  }
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  examples::print_jit("train_step", member_jit.stats());
  e.train_loss /= static_cast<double>(steps);
  return e;
}

int main(int argc, char** argv) {
  examples::Flags f;  // the guide's recipe: Adam 1e-3, a global batch of 64, one model
  f.program = "keras_data_parallel", f.axis = "data", f.batch = 64, f.lr = 1e-3f, f.members = 1;
  examples::parse(f, argc, argv, "the Keras multi-GPU guide's custom loop in C++ (data parallel over 'data')");
  try {
    pmap::Mesh mesh(pmap::local_devices(pmap::parse_device_kind(f.backend), f.devices > 0 ? f.devices : -1), "data");
    f.devices = mesh.size();
    examples::share_cores(f, mesh);
    if (f.members == 0) f.members = 1;  // --members 0: the default, one model
    if (f.batch % f.devices != 0) {
      std::cerr << "keras_data_parallel: --batch " << f.batch << " does not split over " << f.devices << " devices\n";
      return 2;
    }
    const auto train = pmap::train::load_mnist(f.data, pmap::train::Split::train, f.train_limit);
    const auto test = pmap::train::load_mnist(f.data, pmap::train::Split::test, f.test_limit);
    const auto root = pmap::split(pmap::key(f.seed), 2);  // (the models' keys, the data's key)
    const auto member_keys = pmap::split(root[0], f.members);
    const pmap::optim::Adam tx{.learning_rate = f.lr};
    auto state = pmap::pmap([&](int) {  // every device builds the same variables (replicated)
      std::vector<Member> s;
      for (const pmap::Key& k : member_keys) {
        const pmap::Device d = pmap::current_device();
        Params params = init_params(k, d);
        auto opt = tx.init(params);
        const pmap::Key dk = pmap::fold_in(k, examples::kDropoutStream);
        s.push_back({std::move(params), init_stats(d), std::move(opt),
                     Array::from_host(std::vector<std::uint32_t>{dk.k0, dk.k1}, {2}).to(d)});
      }
      return s;
    }, mesh)(0);
    std::printf("%s, %d model(s), global batch %d, %lld training and %lld test images\n", mesh.str().c_str(),
                f.members, f.batch, static_cast<long long>(train.count), static_cast<long long>(test.count));
    examples::Metrics metrics(f);
    for (int epoch = 1; epoch <= f.epochs; ++epoch) {
      const Epoch e = train_epoch(state, train, f, pmap::fold_in(root[1], static_cast<std::uint32_t>(epoch - 1)),
                                  mesh, tx);
      const auto [members, ensemble] = evaluate(state, test, mesh, f.members);
      const double rate = static_cast<double>(f.members) * f.batch *
                          static_cast<double>(pmap::train::steps_per_epoch(train.count, f.batch)) / e.seconds;
      metrics.epoch({.epoch = epoch, .train_loss = e.train_loss, .train_accuracy = -1, .member_test_accuracy = members,
                     .ensemble_test_accuracy = ensemble, .model_images_per_second = rate, .seconds = e.seconds});
    }
    metrics.finish();
  } catch (const pmap::Error& e) {
    std::cerr << "keras_data_parallel: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
