// resnet_ensemble: an ensemble of small residual networks on Fashion-MNIST, a model that a chain of layers
// cannot express (each block adds its input to its output; the second through a 1x1 projection), written
// as plain C++ over pmap::ops and trained with the step a user writes: value_and_grad of the loss, SGD with
// momentum, one pmapped call per batch; members from split keys, their probabilities averaged with pmean
// over "ensemble". Several members per device run one after another on it.
//
//   resnet_ensemble --data data/fashion-mnist [--devices D] [--members M] [--epochs E] [--metrics-json F]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>


#include <pmap/pmap.h>
#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/nn/layers.h>
#include <pmapcc/optim/sgd.h>
#include <pmapcc/train/data.h>

#include "example_flags.h"

namespace ops = pmap::ops;
namespace nn = pmap::nn;
using pmap::Array;

// ---- the model ----------------------------------------------------------------------------------------------
struct Params {
  nn::ConvParams stem, block1_a, block1_b, block2_a, block2_b, project;
  nn::DenseParams head;
};
PMAPCC_TREE(Params, stem, block1_a, block1_b, block2_a, block2_b, project, head)

const nn::Conv conv16{.features = 16}, conv32{.features = 32}, project32{.features = 32, .kernel_h = 1, .kernel_w = 1};
const nn::Dense head{.features = 10};

Params init(pmap::Key key, const pmap::Device& d) {
  auto k = [&](std::uint32_t i) { return pmap::fold_in(key, i); };
  return {conv16.init(k(0), 1, d),  conv16.init(k(1), 16, d),    conv16.init(k(2), 16, d), conv32.init(k(3), 16, d),
          conv32.init(k(4), 32, d), project32.init(k(5), 16, d), head.init(k(6), 7 * 7 * 32, d)};
}

// x (N, 28, 28, 1) -> logits (N, 10): a stem, two residual blocks (28x28x16, then 14x14x32 with a projected
// shortcut), average pooling to 7x7x32 and a dense head.
Array resnet(const Params& p, const Array& x) {
  Array h = conv16(p.stem, x, /*relu=*/true);
  h = ops::relu(ops::add(h, conv16(p.block1_b, conv16(p.block1_a, h, true))));  // x + F(x)
  h = ops::avg_pool(h, 2, 2, 2, 2);
  h = ops::relu(ops::add(project32(p.project, h), conv32(p.block2_b, conv32(p.block2_a, h, true))));
  h = ops::avg_pool(h, 2, 2, 2, 2);
  return head(p.head, ops::reshape(h, {h.dim(0), 7 * 7 * 32}));
}

struct Member {
  Params params;
  pmap::optim::SgdState opt;
};
PMAPCC_TREE(Member, params, opt)

// ---- training and evaluation ----------------------------------------------------------------------------------
// One step for this device's members on the shared batch; returns the sum of their losses.
float train_step(std::vector<Member>& members, const Array& images, const Array& labels, const pmap::optim::Sgd& tx) {
  float total = 0;
  for (Member& m : members) {
    auto loss_fn = [&](const Params& p) { return ops::softmax_cross_entropy(resnet(p, images), labels); };
    auto [loss, grads] = pmap::value_and_grad(loss_fn, "loss_fn")(m.params);
    auto [updates, opt] = tx.update(grads, std::move(m.opt), m.params);
    m.params = pmap::optim::apply_updates(m.params, updates);
    m.opt = std::move(opt);
    total += loss.item<float>();
  }
  return total;
}

struct Predictions {
  std::vector<std::vector<std::int32_t>> members;
  std::vector<std::int32_t> ensemble;
};

Predictions predict(const std::vector<Member>& members, const Array& images) {
  Predictions out;
  Array sum;
  for (const Member& m : members) {
    Array probs = ops::softmax(resnet(m.params, images));
    out.members.push_back(ops::argmax(probs).to_vector<std::int32_t>());
    sum = sum.valid() ? ops::add(sum, probs) : std::move(probs);
  }
  const float share = 1.0f / static_cast<float>(members.size());
  out.ensemble = ops::argmax(pmap::pmean(ops::scale(sum, share), "ensemble")).to_vector<std::int32_t>();
  return out;
}

using Dataset = pmap::train::Dataset;

// (loss, model-images/s) of one epoch over the data in the order permutation(key).
std::pair<double, double> train_epoch(pmap::Sharded<std::vector<Member>>& members, const Dataset& train,
                                      const examples::Flags& c, pmap::Key key, const pmap::Mesh& mesh) {
  const pmap::optim::Sgd tx{.learning_rate = c.lr, .momentum = c.momentum};
  auto step = pmap::pmap([&](std::vector<Member>& m, const Array& x, const Array& y) { return train_step(m, x, y, tx); },
                         mesh, "ensemble");
  const auto order = pmap::permutation(key, static_cast<std::uint32_t>(train.count));
  const auto steps = pmap::train::steps_per_epoch(train.count, c.batch);
  std::vector<float> images(static_cast<std::size_t>(c.batch) * 784);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(c.batch));
  double loss = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t s = 0; s < steps; ++s) {
    pmap::train::gather_batch(train, std::span(order).subspan(static_cast<std::size_t>(s * c.batch),
                                                                 static_cast<std::size_t>(c.batch)),
                                 images.data(), labels.data());
    auto losses = step(members, pmap::replicate(Array::from_host(images, {c.batch, 28, 28, 1}), mesh),
                       pmap::replicate(Array::from_host(labels, {c.batch}), mesh));
    for (float l : losses) loss += l / c.members;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {steps > 0 ? loss / static_cast<double>(steps) : 0.0,
          static_cast<double>(c.members) * c.batch * static_cast<double>(steps) / secs};
}

// Each member's and the ensemble's accuracy on the test set, in chunks of 1000 images.
std::pair<std::vector<double>, double> evaluate(const pmap::Sharded<std::vector<Member>>& members, const Dataset& test,
                                                const pmap::Mesh& mesh) {
  auto run = pmap::pmap(predict, mesh, "ensemble");
  std::vector<double> member_hits;
  double ensemble_hits = 0;
  auto hits = [](const std::vector<std::int32_t>& p, const std::vector<std::int32_t>& labels) {
    double n = 0;
    for (std::size_t i = 0; i < labels.size(); ++i) n += p[i] == labels[i] ? 1 : 0;
    return n;
  };
  for (std::int64_t at = 0; at < test.count; at += 1000) {
    const auto n = static_cast<std::size_t>(std::min<std::int64_t>(1000, test.count - at));
    std::vector<std::uint32_t> rows(n);
    for (std::size_t i = 0; i < n; ++i) rows[i] = static_cast<std::uint32_t>(at) + static_cast<std::uint32_t>(i);
    std::vector<float> images(n * 784);
    std::vector<std::int32_t> labels(n);
    pmap::train::gather_batch(test, rows, images.data(), labels.data());
    auto out = run(members, pmap::replicate(Array::from_host(images, {static_cast<std::int64_t>(n), 28, 28, 1}), mesh));
    std::size_t k = 0;
    for (const Predictions& p : out) {
      for (const auto& m : p.members) {
        if (member_hits.size() <= k) member_hits.push_back(0);
        member_hits[k++] += hits(m, labels);
      }
    }
    ensemble_hits += hits(out[0].ensemble, labels);
  }
  for (double& h : member_hits) h /= static_cast<double>(test.count);
  return {member_hits, ensemble_hits / static_cast<double>(test.count)};
}

int main(int argc, char** argv) {
  examples::Flags c;  // SGD with momentum 0.9, lr 0.1, batch 128, two epochs
  c.program = "resnet_ensemble", c.axis = "ensemble", c.epochs = 2, c.momentum = 0.9f;
  examples::parse(c, argc, argv, "an ensemble of small residual networks (grad inside pmap) on Fashion-MNIST");
  try {
    pmap::Mesh mesh(pmap::local_devices(pmap::parse_device_kind(c.backend), c.devices > 0 ? c.devices : -1), "ensemble");
    c.devices = mesh.size();
    examples::share_cores(c, mesh);
    if (c.members == 0) c.members = c.devices;
    if (c.members % c.devices != 0) {
      std::cerr << "resnet_ensemble: --members " << c.members << " is not a multiple of --devices " << c.devices << "\n";
      return 2;
    }
    const Dataset train = pmap::train::load_mnist(c.data, pmap::train::Split::train, c.train_limit);
    const Dataset test = pmap::train::load_mnist(c.data, pmap::train::Split::test, c.test_limit);
    const auto root = pmap::split(pmap::key(c.seed), 2);
    const auto keys = pmap::split(root[0], c.members);
    const int per_device = c.members / c.devices;
    auto members = pmap::pmap([&](int) {
      std::vector<Member> mine;
      for (int j = 0; j < per_device; ++j) {
        Params p = init(keys[static_cast<std::size_t>(pmap::axis_index("ensemble") * per_device + j)],
                        pmap::current_device());
        auto opt = pmap::optim::Sgd{.learning_rate = c.lr, .momentum = c.momentum}.init(p);
        mine.push_back({std::move(p), std::move(opt)});
      }
      return mine;
    }, mesh, "ensemble")(0);
    std::printf("%s, %d residual networks, %lld training and %lld test images\n", mesh.str().c_str(), c.members,
                static_cast<long long>(train.count), static_cast<long long>(test.count));
    examples::Metrics metrics(c);
    for (int epoch = 1; epoch <= c.epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto [loss, rate] = train_epoch(members, train, c, pmap::fold_in(root[1], static_cast<std::uint32_t>(epoch - 1)), mesh);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const auto [member_accuracy, ensemble] = evaluate(members, test, mesh);
      metrics.epoch({.epoch = epoch, .train_loss = loss, .train_accuracy = -1, .member_test_accuracy = member_accuracy,
                     .ensemble_test_accuracy = ensemble, .model_images_per_second = rate, .seconds = seconds});
    }
    metrics.finish();
  } catch (const pmap::Error& e) {
    std::cerr << "resnet_ensemble: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
