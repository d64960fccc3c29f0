// Models as inputs to train::Trainer: the registry's names (the program's --model choices), and a model of the
// caller's written with make_model and nn's modules (a strided valid Conv2D, an even-kernel SAME Conv2D without
// bias, global average pooling, a dense head): its architecture recorded module by module, its ensemble trained
// bit for bit run after run, and data parallel on 2 devices as on one, up to the order of the sums.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/nn/layers.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/model.h>
#include <pmapcc/train/trainer.h>

#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace nn = pmap::nn;
namespace pe = pmap::ensemble;
namespace train = pmap::train;

// The caller's model's parameters: a convolution with a bias, one without, a dense head.
struct KerasLike {
  nn::ConvParams Conv_0;
  nn::ConvKernel Conv_1;
  nn::DenseParams Dense_0;
};
PMAPCC_TREE(KerasLike, Conv_0, Conv_1, Dense_0)

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

pmap::Mesh cpu_mesh(int devices, const char* axis) {
  return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), axis);
}

// On 12x12 images: a 3x3 stride-2 valid conv (5x5x8), a 2x2 SAME conv without bias (its padding asymmetric: the
// extra row and column after; 5x5x12), global average pooling (12), a dense head.
train::Model keras_like() {
  const nn::Conv strided{.features = 8, .kernel_h = 3, .kernel_w = 3, .stride_h = 2, .stride_w = 2, .same = false};
  const nn::Conv even{.features = 12, .kernel_h = 2, .kernel_w = 2};
  const nn::Dense head{.features = 10};
  return train::make_model<KerasLike>(
      "keras-like", {12, 12, 1}, 10,
      [=](pmap::Key key, const pmap::Device& d) {
        return std::pair{KerasLike{strided.init(pmap::fold_in(key, 0), 1, d),
                                   even.init_kernel(pmap::fold_in(key, 2), 8, d),
                                   head.init(pmap::fold_in(key, 3), 12, d)},
                         train::NoState{}};
      },
      [=](const KerasLike& p, const train::NoState& s, const pmap::Array& x, const train::Call&) {
        const pmap::Array h = even(p.Conv_1, strided(p.Conv_0, x, /*relu=*/true), /*relu=*/true);
        return std::pair{head(p.Dense_0, pmap::ops::global_avg_pool(h)), s};
      });
}

const train::Optimizer& momentum() {
  static const train::Optimizer o(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f});
  return o;
}

}  // namespace

TEST_CASE("train models: the registry names the program's models and builds each by its name") {
  CHECK(train::model_names() == std::vector<std::string>{"flax-cnn", "keras-convnet"});
  CHECK(pe::model_names() == train::model_names());  // --model's choices
  for (const std::string& name : train::model_names()) {
    CAPTURE(name);
    const train::Model m = train::model_by_name(name, {28, 28, 1}, 10);
    CHECK(m.name() == name);
    CHECK(m.classes() == 10);
    CHECK(m.architecture().at(0) == "(28, 28, 1)");
  }
}

TEST_CASE("train models: a model of the caller's trains as an ensemble, bit for bit run after run") {
  const train::Model model = keras_like();
  CHECK(model.architecture() == std::vector<std::string>{"(12, 12, 1)", "Conv_0=Conv2D(8, 3x3, stride 2, valid, relu)",
                                                         "Conv_1=Conv2D(12, 2x2, no bias, relu)",
                                                         "Dense_0=Dense(10)"});
  train::Trainer a(model, momentum(), cpu_mesh(2, "ensemble"), {.members = 2, .batch_size = 64});
  train::Trainer b(model, momentum(), cpu_mesh(2, "ensemble"), {.members = 2, .batch_size = 64});
  const std::vector<float> before = pmap::testing::stacked(a.params(), model.param_names());
  const train::EpochReport ra = a.run_epoch(data().train), rb = b.run_epoch(data().train);
  const std::vector<float> after = pmap::testing::stacked(a.params(), model.param_names());
  CHECK(after != before);
  CHECK(after == pmap::testing::stacked(b.params(), model.param_names()));
  CHECK(std::isfinite(ra.train_loss));
  CHECK(ra.train_loss == rb.train_loss);
  CHECK(a.evaluate(data().test).member_accuracy == b.evaluate(data().test).member_accuracy);
  // Data parallel on 2 devices is one device up to float reassociation.
  train::Trainer two(model, momentum(), cpu_mesh(2, "data"), {.data_parallel = true, .batch_size = 64});
  train::Trainer one(model, momentum(), cpu_mesh(1, "data"), {.data_parallel = true, .batch_size = 64});
  two.run_epoch(data().train);
  one.run_epoch(data().train);
  CHECK(pmap::testing::max_abs_diff(pmap::testing::stacked(two.params(), model.param_names()),
                                    pmap::testing::stacked(one.params(), model.param_names())) < 1e-5f);
}

}  // namespace PMAPCC_TEST_FILE
