// A model of your own, trained as an ensemble: the README's example of building a Sequential from the
// public API (strided and valid convolutions, one without a bias followed by BatchNormalization, global
// average pooling, Dropout) and training
// it with AdamW and a cosine schedule, one or more members per device, then printing each member's and
// the ensemble's test accuracy.
//
//   custom_model DATA_DIR [EPOCHS [TRAIN_LIMIT]]      (DATA_DIR: the MNIST IDX files)
#include <cstdio>
#include <string>

#include <pmapcc/ensemble/trainer.h>

namespace pe = pmap::ensemble;

// 28x28x1 -> (13, 13, 16) -> (7, 7, 32) -> (32) -> (10): 5,162 parameters and 64 moving statistics per member.
std::unique_ptr<pe::Sequential> small_convnet() {
  std::vector<std::unique_ptr<pe::Layer>> layers;
  layers.push_back(
      pe::conv2d("Conv_0", 16, pe::Conv2dOptions{.kernel = 3, .stride = 2, .padding = pmap::kernels::Padding::valid}));
  layers.push_back(pe::relu());
  layers.push_back(pe::conv2d("Conv_1", 32, pe::Conv2dOptions{.kernel = 3, .stride = 2, .use_bias = false}));
  layers.push_back(pe::batch_norm("BatchNorm_0"));
  layers.push_back(pe::relu());
  layers.push_back(pe::global_avg_pool());
  layers.push_back(pe::dropout("dropout", 0.2f));
  layers.push_back(pe::dense("Dense_0", 10));
  return std::make_unique<pe::Sequential>(pe::Dims{28, 28, 1}, std::move(layers), "small-convnet");
}

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: custom_model DATA_DIR [EPOCHS [TRAIN_LIMIT]]\n");
    return 2;
  }
  const pe::Dataset train = pe::load_mnist(argv[1], pe::Split::train, argc > 3 ? std::stoll(argv[3]) : -1);
  const pe::Dataset test = pe::load_mnist(argv[1], pe::Split::test);
  pe::TrainConfig config;  // one member per device; CPU devices unless config.backend = cuda
  config.epochs = argc > 2 ? std::stoi(argv[2]) : 3;
  if (config.epochs < 1) {
    std::fprintf(stderr, "custom_model: EPOCHS must be >= 1\n");
    return 2;
  }
  config.batch_size = 64;
  config.optimizer.name = "adamw";
  config.optimizer.learning_rate = {3e-3f};
  config.optimizer.schedule = pe::parse_schedule("cosine");
  pe::Trainer trainer(config, small_convnet(), train, test);
  std::printf("%s\n", trainer.model().summary().c_str());
  for (int e = 0; e < config.epochs; ++e) {
    const pe::EpochMetrics m = trainer.run_epoch();
    std::printf("epoch %d: train loss %.4f, ensemble test accuracy %.2f %%\n", m.epoch, m.train_loss,
                100 * m.ensemble_test_accuracy);
  }
  const pe::EpochMetrics& last = trainer.history().back();
  for (std::size_t g = 0; g < last.member_test_accuracy.size(); ++g)
    std::printf("member %zu: %.2f %%\n", g, 100 * last.member_test_accuracy[g]);
  std::printf("ensemble of %d: %.2f %%\n", trainer.total_members(), 100 * last.ensemble_test_accuracy);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_model: error: %s\n", e.what());
  return 1;
}
