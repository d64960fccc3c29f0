// A model with state and randomness (keras-convnet: BatchNormalization's moving statistics, Dropout) on
// train::Trainer: the moving statistics start at 0 and 1 and move in every member, apart from the parameters;
// an ensemble's members train bit for bit alike on one device or spread over two (each member's Dropout masks
// come from its own key); and on the CUDA kernels run on the host, a step replayed as a captured graph draws new
// masks and moves the statistics as the eager step does. (BatchNorm's and Dropout's arithmetic is
// tests/test_nn.cpp's and tests/test_grad.cpp's; resuming such a run, tests/test_train_checkpoint.cpp's.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace train = pmap::train;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

using pmap::testing::stacked;

pmap::Mesh cpu_mesh(int devices) { return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "ensemble"); }

const train::Optimizer& adam() {
  static const train::Optimizer o(pmap::optim::Adam{.learning_rate = 1e-3f});
  return o;
}

// Member g's row of a host tensor (members, ...).
std::vector<float> row(const pmap::Array& a, std::int64_t g) {
  const std::vector<float> all = a.to_vector<float>();
  const auto each = static_cast<std::ptrdiff_t>(all.size() / static_cast<std::size_t>(a.dim(0)));
  return {all.begin() + g * each, all.begin() + (g + 1) * each};
}

}  // namespace

TEST_CASE("keras-convnet's moving statistics start at 0 and 1, move in every member, and train alike on any devices") {
  // 2 members spread over 2 devices, and both on 1 device: one epoch of 10 steps each, Adam 1e-3.
  const train::Model convnet = train::keras_convnet({12, 12, 1});
  const train::TrainerOptions o{.members = 2, .batch_size = 64};
  train::Trainer spread(convnet, adam(), cpu_mesh(2), o), packed(convnet, adam(), cpu_mesh(1), o);
  const std::vector<std::string>& names = convnet.state_names();
  REQUIRE(!names.empty());
  const train::Variables start = spread.model_state();
  REQUIRE(start.size() == names.size());
  for (const std::string& name : names) {  // (members, channels): means 0, variances 1, as Keras starts them
    CAPTURE(name);
    const pmap::Array& a = start.at(name);
    REQUIRE(a.shape().size() == 2);
    CHECK(a.dim(0) == 2);
    const bool mean = name.ends_with("/moving_mean");
    CHECK((mean || name.ends_with("/moving_variance")));
    const std::vector<float> v = a.to_vector<float>();
    CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return x == (mean ? 0.0f : 1.0f); }));
  }
  for (const std::string& name : convnet.param_names()) {  // the statistics are no parameters
    CAPTURE(name);
    CHECK(name.find("moving") == std::string::npos);
    CHECK(start.count(name) == 0);
  }
  spread.run_epoch(data().train);
  packed.run_epoch(data().train);
  const train::Variables moved = spread.model_state();
  for (const std::string& name : names) {  // training moves every member's statistics, each its own
    CAPTURE(name);
    for (std::int64_t g = 0; g < 2; ++g) CHECK(row(moved.at(name), g) != row(start.at(name), g));
    CHECK(row(moved.at(name), 0) != row(moved.at(name), 1));
  }
  // Where a member trains changes none of its bits: its batches, its Dropout masks (from its key) and its
  // batch statistics are its own.
  CHECK(stacked(packed.params(), convnet.param_names()) == stacked(spread.params(), convnet.param_names()));
  CHECK(stacked(packed.model_state(), names) == stacked(moved, names));
}

TEST_CASE("keras-convnet on the CUDA kernels run on the host: a captured step trains as the eager step") {
  // The step reads its counter and the members' Dropout keys on the device: every replay of the captured graph
  // draws new masks and moves BatchNorm's statistics, as the step run kernel by kernel does. 5 steps of 2 members
  // (the host run's GEMM is a plain loop, slow under the sanitizers).
  const train::Model convnet = train::keras_convnet({12, 12, 1});
  const train::Dataset examples = pmap::testing::synthetic_dataset(320, 12, 1);
  const train::TrainerOptions graphs{.members = 2, .batch_size = 64,
                                     .cpu_backend = &pmap::kernels::cuda_backend_on_host()};
  train::TrainerOptions eager = graphs;
  eager.graphs = false;
  train::Trainer g(convnet, adam(), cpu_mesh(1), graphs), e(convnet, adam(), cpu_mesh(1), eager);
  g.run_epoch(examples);
  e.run_epoch(examples);
  const pmap::JitStats captured = g.train_step().stats();
  INFO(captured.graph_refusal);
  CHECK(captured.graph_launches > 0);  // the steps after the first ran as one graph each
  CHECK(e.train_step().stats().graph_launches == 0);
  CHECK(stacked(g.params(), convnet.param_names()) == stacked(e.params(), convnet.param_names()));
  CHECK(stacked(g.model_state(), convnet.state_names()) == stacked(e.model_state(), convnet.state_names()));
  CHECK(g.step() == 5);
}

}  // namespace PMAPCC_TEST_FILE
