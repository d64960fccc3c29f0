// A model of your own, trained as an ensemble: the README's example of writing a model as module code
// (strided and valid convolutions, one without a bias followed by BatchNormalization, global average pooling,
// Dropout) and training it with train::Trainer, AdamW and a cosine schedule, one member per device, then
// printing each member's and the ensemble's test accuracy.
//
//   custom_model DATA_DIR [EPOCHS [TRAIN_LIMIT]]      (DATA_DIR: the MNIST IDX files)
#include <cstdio>
#include <string>

#include <pmap/pmap.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

namespace nn = pmap::nn;
namespace ops = pmap::ops;
namespace train = pmap::train;

// The variables, named as checkpoints name them: "Conv_0/kernel", "BatchNorm_0/gamma",
// "BatchNorm_0/moving_mean", ...
struct Params {
  nn::ConvParams Conv_0;
  nn::ConvKernel Conv_1;
  nn::BatchNormParams BatchNorm_0;
  nn::DenseParams Dense_0;
};
PMAPCC_TREE(Params, Conv_0, Conv_1, BatchNorm_0, Dense_0)
struct State {
  nn::BatchNormState BatchNorm_0;
};
PMAPCC_TREE(State, BatchNorm_0)

// 28x28x1 -> (13, 13, 16) -> (7, 7, 32) -> (32) -> (10): 5,162 parameters and 64 moving statistics per member.
train::Model small_convnet() {
  const nn::Conv conv0{.features = 16, .stride_h = 2, .stride_w = 2, .same = false};
  const nn::Conv conv1{.features = 32, .stride_h = 2, .stride_w = 2};
  const nn::BatchNorm bn{};
  const nn::Dropout dropout{.rate = 0.2f};
  const nn::Dense head{.features = 10};
  return train::make_model<Params, State>(
      "small-convnet", {28, 28, 1}, 10,
      [=](pmap::Key key, const pmap::Device& d) {  // each kernel from its own key
        auto k = [&](std::uint32_t i) { return pmap::fold_in(key, i); };
        return std::pair{Params{conv0.init(k(0), 1, d), conv1.init_kernel(k(1), 16, d), bn.init(32, d),
                                head.init(k(2), 32, d)},
                         State{bn.init_state(32, d)}};
      },
      [=](const Params& p, const State& s, const pmap::Array& x, const train::Call& call) {
        const pmap::Array h = conv1(p.Conv_1, conv0(p.Conv_0, x, /*relu=*/true));
        auto [normed, moving] = bn(p.BatchNorm_0, s.BatchNorm_0, h,
                                   {.train = call.train, .relu = true, .batch_examples = call.batch_examples});
        const pmap::Array pooled = dropout(ops::global_avg_pool(normed),
                                           {.train = call.train, .rng = call.rng, .rate = call.dropout_rate});
        return std::pair{head(p.Dense_0, pooled), State{std::move(moving)}};
      },
      /*dropout_layers=*/1);
}

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: custom_model DATA_DIR [EPOCHS [TRAIN_LIMIT]]\n");
    return 2;
  }
  const int epochs = argc > 2 ? std::stoi(argv[2]) : 3;
  if (epochs < 1) {
    std::fprintf(stderr, "custom_model: EPOCHS must be >= 1\n");
    return 2;
  }
  const train::Dataset train_set = train::load_mnist(argv[1], train::Split::train, argc > 3 ? std::stoll(argv[3]) : -1);
  const train::Dataset test_set = train::load_mnist(argv[1], train::Split::test);
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu), "ensemble");  // one member per device
  const int batch = 64;
  const std::int64_t steps = epochs * train::steps_per_epoch(train_set.count, batch);
  const pmap::optim::AdamW adamw{.learning_rate = pmap::optim::cosine_decay_schedule(3e-3f, {.decay_steps = steps})};
  train::Trainer trainer(small_convnet(), train::Optimizer(adamw), std::move(mesh),
                         {.members = static_cast<int>(pmap::local_devices(pmap::DeviceKind::cpu).size()),
                          .batch_size = batch});
  std::printf("%s\n", trainer.model().summary().c_str());
  train::Evaluation test;
  for (int e = 0; e < epochs; ++e) {
    const train::EpochReport r = trainer.run_epoch(train_set);
    test = trainer.evaluate(test_set);
    std::printf("epoch %d: train loss %.4f, ensemble test accuracy %.2f %%\n", r.epoch, r.train_loss,
                100 * test.ensemble_accuracy);
  }
  for (std::size_t g = 0; g < test.member_accuracy.size(); ++g)
    std::printf("member %zu: %.2f %%\n", g, 100 * test.member_accuracy[g]);
  std::printf("ensemble of %zu: %.2f %%\n", test.member_accuracy.size(), 100 * test.ensemble_accuracy);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_model: error: %s\n", e.what());
  return 1;
}
