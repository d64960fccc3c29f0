// flax_ensemble: Flax's ensembling how-to ("Ensembling on multiple devices") written in C++ as the how-to
// writes it in Python: the CNN as a function of modules, create_train_state pmapped over the members'
// keys, apply_model pmapped with value_and_grad (has_aux: the logits) and the ensemble's probabilities
// pmean'd over "ensemble", update_model applying optax-style SGD, the epoch loop, and each member's and
// the ensemble's test accuracy. A device's members (more members than devices) are mapped over their
// stacked parameters with pmap::map (jax.lax.map with a batch_size): a vmap of batch_size members at a time,
// one on a CPU device (each member's layers back to back while its activations are in the caches, as the
// Trainer runs them), all of them on a GPU (one kernel call per layer for all of them). Both steps are
// jitted inside pmap: each device plans its buffers on the first step and replays the plan. The keys, the
// data order and the arithmetic are mnist_ensemble's (--model flax-cnn), so the two programs train the same
// models from the same seed.
//
//   flax_ensemble --data data/mnist [--devices D] [--members M] [--epochs E] [--seed S] [--metrics-json F]
//                 [--save F] [--precision fp32|bf16] [--cpu-threads T]
#include <chrono>
#include <cstdio>
#include <iostream>
#include <span>
#include <string>
#include <vector>


#include <pmap/pmap.h>
#include <pmapcc/core/grad.h>
#include <pmapcc/core/jit.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/nn/layers.h>
#include <pmapcc/optim/sgd.h>
#include <pmapcc/train/data.h>

#include "example_flags.h"

namespace ops = pmap::ops;
namespace nn = pmap::nn;
using pmap::Array;

// ---- class CNN(nn.Module) ----------------------------------------------------------------------------------
struct CnnParams {
  nn::ConvParams Conv_0, Conv_1;
  nn::DenseParams Dense_0, Dense_1;
};
PMAPCC_TREE(CnnParams, Conv_0, Conv_1, Dense_0, Dense_1)

const nn::Conv conv0{.features = 32}, conv1{.features = 64};
const nn::Dense dense0{.features = 256}, dense1{.features = 10};

Array cnn(const CnnParams& p, const Array& x) {  // x (N, 28, 28, 1) -> logits (N, 10)
  Array h = ops::avg_pool(conv0(p.Conv_0, x, /*relu=*/true), 2, 2, 2, 2);
  h = ops::avg_pool(conv1(p.Conv_1, h, /*relu=*/true), 2, 2, 2, 2);
  h = dense0(p.Dense_0, ops::reshape(h, {h.dim(0), h.size() / h.dim(0)}), /*relu=*/true);
  return dense1(p.Dense_1, h);
}

// cnn.init(key, ones([1, 28, 28, 1])): each kernel from the key folded with its tensor's index in the
// model (as mnist_ensemble derives them), the biases zero.
CnnParams init_cnn(pmap::Key key, const pmap::Device& d) {
  return {conv0.init(pmap::fold_in(key, 0), 1, d), conv1.init(pmap::fold_in(key, 2), 32, d),
          dense0.init(pmap::fold_in(key, 4), 7 * 7 * 64, d), dense1.init(pmap::fold_in(key, 6), 256, d)};
}

// ---- flax.training.train_state.TrainState and the pmapped steps --------------------------------------------
// One per device: its members' parameters stacked (members, ...), and SGD's state of them (the momentum
// element by element, so the stacked members step as each would alone; one step counter).
struct TrainState {
  CnnParams params;
  pmap::optim::SgdState opt_state;
};
PMAPCC_TREE(TrainState, params, opt_state)

struct Applied {  // apply_model's results on one device
  CnnParams grads;  // stacked, one per member
  Array loss;       // the sum of this device's members' losses
  Array predicted;  // the ensemble's argmax, after pmean over "ensemble"
};
PMAPCC_TREE(Applied, grads, loss, predicted)

Applied apply_model(const TrainState& state, const Array& images, const Array& labels) {
  // vmap over the stacked members, batch_size of them at a time (jax.lax.map): on a CPU device one member's
  // layers back to back, its activations kept in the caches; on a GPU all of them in one kernel per layer.
  const std::int64_t batch_size = images.device().is_cpu() ? 1 : state.params.Conv_0.kernel.dim(0);
  auto loss_and_grads = pmap::map([&](const CnnParams& params) {  // each member's loss and gradients
    auto loss_fn = [&](const CnnParams& p) {
      Array logits = cnn(p, images);
      return std::make_pair(ops::softmax_cross_entropy(logits, labels), std::move(logits));
    };
    return pmap::value_and_grad(loss_fn, "loss_fn")(params);
  }, batch_size, {0}, "apply_model");
  auto [loss_and_logits, grads] = loss_and_grads(state.params);
  Array probs = ops::mean(ops::softmax(loss_and_logits.second), {0});  // this device's members' mean
  return {std::move(grads), ops::sum(loss_and_logits.first), ops::argmax(pmap::pmean(probs, "ensemble"))};
}

TrainState update_model(const TrainState& state, const CnnParams& grads, const pmap::optim::Sgd& tx) {
  auto [updates, opt_state] = tx.update(grads, state.opt_state, state.params);
  return {pmap::optim::apply_updates(state.params, updates), std::move(opt_state)};  // state.apply_gradients
}

// ---- the epoch loop and the evaluation ----------------------------------------------------------------------
double hits(std::span<const std::int32_t> predicted, const std::vector<std::int32_t>& labels) {
  double n = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) n += predicted[i] == labels[i] ? 1 : 0;
  return n;
}

struct Epoch {
  double train_loss = 0, train_accuracy = 0, seconds = 0;
};

// One pass over the training set in the order permutation(key) (full batches; the rest is dropped).
Epoch train_epoch(pmap::Sharded<TrainState>& states, const pmap::train::Dataset& train,
                  const examples::Flags& c, pmap::Key key, const pmap::Mesh& mesh, const pmap::optim::Sgd& tx) {
  const auto order = pmap::permutation(key, static_cast<std::uint32_t>(train.count));
  const auto steps = pmap::train::steps_per_epoch(train.count, c.batch);
  // jax.pmap compiles the steps; here jit plans each device's buffers on the first step and replays the plan,
  // so a step allocates only its results.
  auto apply_jit = pmap::jit(apply_model, "apply_model");
  auto update_jit = pmap::jit([&](const TrainState& s, const CnnParams& g) { return update_model(s, g, tx); },
                              "update_model");
  auto apply = pmap::pmap([&](const TrainState& s, const Array& x, const Array& y) {
    ops::DefaultPrecision precision(c.precision);  // --precision: the products' arithmetic on this device
    return apply_jit(s, x, y);
  }, mesh, "ensemble");
  auto update = pmap::pmap([&](TrainState& s, const Applied& a) { s = update_jit(s, a.grads); }, mesh);
  std::vector<float> images(static_cast<std::size_t>(c.batch) * 784);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(c.batch));
  Epoch e;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t s = 0; s < steps; ++s) {
    pmap::train::gather_batch(train, std::span(order).subspan(static_cast<std::size_t>(s * c.batch),
                                                                 static_cast<std::size_t>(c.batch)),
                                 images.data(), labels.data());
    auto x = pmap::replicate(Array::from_host(images, {c.batch, 28, 28, 1}), mesh);
    auto y = pmap::replicate(Array::from_host(labels, {c.batch}), mesh);
    auto applied = apply(states, x, y);
    for (const Applied& a : applied) e.train_loss += a.loss.item<float>() / c.members;
    e.train_accuracy += hits(applied[0].predicted.to_vector<std::int32_t>(), labels) / c.batch;
    update(states, applied);
  }
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  examples::print_jit("apply_model", apply_jit.stats());
  examples::print_jit("update_model", update_jit.stats());
  e.train_loss /= static_cast<double>(steps);
  e.train_accuracy /= static_cast<double>(steps);
  return e;
}

struct Predicted {
  std::vector<std::int32_t> members;  // this device's members' argmax, member after member
  std::vector<std::int32_t> ensemble;
};

// Each member's and the ensemble's test accuracy, in chunks of 1000 images.
std::pair<std::vector<double>, double> evaluate(const pmap::Sharded<TrainState>& states,
                                                const pmap::train::Dataset& test, const pmap::Mesh& mesh,
                                                pmap::kernels::Precision precision) {
  auto predict = pmap::pmap([&](const TrainState& s, const Array& x) {
    ops::DefaultPrecision scope(precision);
    Array probs = ops::softmax(pmap::vmap(cnn, {0, pmap::none}, "cnn")(s.params, x));  // (members, N, 10)
    return Predicted{ops::argmax(probs).to_vector<std::int32_t>(),
                     ops::argmax(pmap::pmean(ops::mean(probs, {0}), "ensemble")).to_vector<std::int32_t>()};
  }, mesh, "ensemble");
  std::vector<double> member_hits;
  double ensemble_hits = 0;
  for (std::int64_t at = 0; at < test.count; at += 1000) {
    const std::int64_t n = std::min<std::int64_t>(1000, test.count - at);
    std::vector<std::uint32_t> rows(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) rows[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>(at + i);
    std::vector<float> images(static_cast<std::size_t>(n) * 784);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
    pmap::train::gather_batch(test, rows, images.data(), labels.data());
    auto out = predict(states, pmap::replicate(Array::from_host(images, {n, 28, 28, 1}), mesh));
    std::size_t m = 0;
    for (const Predicted& p : out) {
      for (std::size_t from = 0; from < p.members.size(); from += labels.size(), ++m) {
        if (member_hits.size() <= m) member_hits.push_back(0);
        member_hits[m] += hits(std::span(p.members).subspan(from, labels.size()), labels);
      }
    }
    ensemble_hits += hits(out[0].ensemble, labels);
  }
  for (double& h : member_hits) h /= static_cast<double>(test.count);
  return {member_hits, ensemble_hits / static_cast<double>(test.count)};
}

// --save: every member's parameters, as mnist_ensemble's checkpoints name them.
void save(const pmap::Sharded<TrainState>& states, const std::string& path) {
  std::vector<std::string> names;
  pmap::tree_for_each_with_path(states[0].params, [&](const std::string& name, const Array&) { names.push_back(name); });
  std::vector<std::vector<const Array*>> leaves;
  for (const TrainState& s : states) {
    leaves.emplace_back();
    pmap::tree_for_each(s.params, [&](const Array& a) { leaves.back().push_back(&a); });
  }
  examples::save_params(path, names, leaves);
}

int main(int argc, char** argv) {
  examples::Flags c;  // the how-to's recipe: SGD, lr 0.1, momentum 0.9, batch 128
  c.program = "flax_ensemble", c.axis = "ensemble", c.momentum = 0.9f, c.can_save = true;
  c.has_precision = true;
  examples::parse(c, argc, argv, "Flax's ensembling how-to in C++ (pmap, value_and_grad, pmean of probabilities)");
  try {
    const auto kind = pmap::parse_device_kind(c.backend);
    pmap::Mesh mesh(pmap::local_devices(kind, c.devices > 0 ? c.devices : -1), "ensemble");
    c.devices = mesh.size();
    examples::share_cores(c, mesh);
    if (c.members == 0) c.members = c.devices;
    if (c.members % c.devices != 0) {
      std::cerr << "flax_ensemble: --members " << c.members << " is not a multiple of --devices " << c.devices << "\n";
      return 2;
    }
    const auto train = pmap::train::load_mnist(c.data, pmap::train::Split::train, c.train_limit);
    const auto test = pmap::train::load_mnist(c.data, pmap::train::Split::test, c.test_limit);
    const auto root = pmap::split(pmap::key(c.seed), 2);  // (init_rng, the data's key)
    const auto member_keys = pmap::split(root[0], c.members);
    const pmap::optim::Sgd tx{.learning_rate = c.lr, .momentum = c.momentum};
    const int per_device = c.members / c.devices;
    auto states = pmap::pmap([&](int) {  // create_train_state, pmapped over the members' keys
      std::vector<CnnParams> members;
      for (int j = 0; j < per_device; ++j) {
        const auto k = static_cast<std::size_t>(pmap::axis_index("ensemble") * per_device + j);
        members.push_back(init_cnn(member_keys[k], pmap::current_device()));
      }
      CnnParams params = pmap::stack_trees(members);
      auto opt_state = tx.init(params);
      return TrainState{std::move(params), std::move(opt_state)};
    }, mesh, "ensemble")(0);
    std::printf("%s, %d members, %lld training and %lld test images\n", mesh.str().c_str(), c.members,
                static_cast<long long>(train.count), static_cast<long long>(test.count));
    examples::Metrics metrics(c);
    for (int epoch = 1; epoch <= c.epochs; ++epoch) {
      const Epoch e = train_epoch(states, train, c, pmap::fold_in(root[1], static_cast<std::uint32_t>(epoch - 1)),
                                  mesh, tx);
      const auto [members, ensemble] = evaluate(states, test, mesh, c.precision);
      const double rate = static_cast<double>(c.members) * c.batch *
                          static_cast<double>(pmap::train::steps_per_epoch(train.count, c.batch)) / e.seconds;
      metrics.epoch({.epoch = epoch, .train_loss = e.train_loss, .train_accuracy = e.train_accuracy,
                     .member_test_accuracy = members, .ensemble_test_accuracy = ensemble,
                     .model_images_per_second = rate, .seconds = e.seconds});
    }
    metrics.finish();
    if (!c.save.empty()) save(states, c.save);
  } catch (const pmap::Error& e) {
    std::cerr << "flax_ensemble: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
