// train::Trainer, the loop on the differentiable core: an epoch of an ensemble and of a data-parallel model
// trains bit for bit as the runner's Trainer (ensemble::Trainer) trains it, with its per-step numbers; the runs
// repeat bitwise; and the errors of bad options and data, each before any step.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "cuda_testing.h"
#include "synthetic.h"

namespace pe = pmap::ensemble;
namespace train = pmap::train;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

pmap::Mesh cpu_mesh(int devices, const char* axis) {
  return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), axis);
}

// The Trainer's variables stacked as the runner's Trainer::params() and model_state() give them: each tensor
// in `names` order, its members in order.
std::vector<float> stacked(const train::Variables& v, const std::vector<std::string>& names) {
  std::vector<float> out;
  for (const std::string& n : names) {
    const auto t = v.at(n).to_vector<float>();
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

struct Reports {
  std::vector<pe::StepReport> old;
  std::vector<train::StepReport> now;
};

// The reports of a step agree: the same losses and counts summed in the same order.
void check_same(const Reports& r) {
  REQUIRE(r.now.size() == r.old.size());
  for (std::size_t i = 0; i < r.old.size(); ++i) {
    CAPTURE(i);
    CHECK(r.now[i].step == r.old[i].step);
    CHECK(r.now[i].steps == r.old[i].steps);
    CHECK(r.now[i].loss == r.old[i].loss);
    CHECK(r.now[i].running_loss == r.old[i].running_loss);
    CHECK(r.now[i].running_accuracy == r.old[i].running_accuracy);
  }
}

}  // namespace

TEST_CASE("trainer: an ensemble's epochs train bit for bit as the runner's Trainer trains them") {
  // flax-cnn, 4 members on 2 devices, SGD lr 0.1 momentum 0.9, seed 3: two epochs of 10 steps.
  pe::TrainConfig c = pmap::testing::small_config(2, 4);
  c.seed = 3;
  pe::Trainer old(c, data().train, data().test);
  train::Trainer now(train::flax_cnn({12, 12, 1}),
                     train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
                     cpu_mesh(2, "ensemble"), {.members = 4, .batch_size = 64, .seed = 3});
  CHECK(now.members_per_device() == 2);
  for (int epoch = 1; epoch <= 2; ++epoch) {
    CAPTURE(epoch);
    Reports r;
    const pe::EpochMetrics m = old.run_epoch([&](const pe::StepReport& s) { r.old.push_back(s); });
    const train::EpochReport e = now.run_epoch(data().train, [&](const train::StepReport& s) { r.now.push_back(s); });
    check_same(r);
    CHECK(e.epoch == epoch);
    CHECK(e.steps == 10);
    CHECK(e.train_loss == m.train_loss);
    CHECK(e.train_accuracy == m.train_accuracy);
    CHECK(e.images_per_second > 0);
  }
  const auto names = now.model().param_names();
  const train::Variables p = now.params();
  CHECK(p.at("Conv_0/kernel").shape() == pmap::Shape{4, 3, 3, 1, 32});
  CHECK(stacked(p, names) == old.params());
  CHECK(now.step() == 20);
  CHECK(now.epochs_done() == 2);
}

TEST_CASE("trainer: BatchNorm, Dropout and Adam data parallel, every 4 steps, as the runner's Trainer") {
  // keras-convnet, one model over two devices, Adam 1e-3, losses read every 4 steps (and at the epoch's end).
  pe::TrainConfig c = pmap::testing::small_config(2, 1);
  c.model = "keras-convnet";
  c.optimizer.name = "adam";
  c.mode = pe::Mode::data_parallel;
  c.report_every = 4;
  pe::Trainer old(c, data().train, data().test);
  train::Trainer now(train::keras_convnet({12, 12, 1}), train::Optimizer(pmap::optim::Adam{.learning_rate = 1e-3f}),
                     cpu_mesh(2, "data"), {.data_parallel = true, .batch_size = 64, .report_every = 4});
  Reports r;
  const pe::EpochMetrics m = old.run_epoch([&](const pe::StepReport& s) { r.old.push_back(s); });
  const train::EpochReport e = now.run_epoch(data().train, [&](const train::StepReport& s) { r.now.push_back(s); });
  REQUIRE(r.now.size() == r.old.size());
  for (std::size_t i = 0; i < r.old.size(); ++i) {
    // The runner averages the devices' block losses; the step pmeans them: the same value, rounded apart.
    CHECK(r.now[i].loss == doctest::Approx(r.old[i].loss).epsilon(1e-6));
    CHECK(r.now[i].running_accuracy == r.old[i].running_accuracy);
  }
  CHECK(e.train_accuracy == m.train_accuracy);
  const train::Model& model = now.model();
  CHECK(stacked(now.params(), model.param_names()) == old.params());
  CHECK(stacked(now.model_state(), model.state_names()) == old.model_state());
  CHECK(now.params().at("Dense_0/kernel").dim(0) == 1);  // the one model
}

TEST_CASE("trainer: the same seed gives the same bits, another seed other members, per-member values their own") {
  auto run = [](std::uint64_t seed, train::MemberHyperparams hyper) {
    train::Trainer t(train::flax_cnn({12, 12, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.05f}),
                     cpu_mesh(2, "ensemble"), {.members = 2, .batch_size = 64, .seed = seed, .hyperparams = hyper});
    t.run_epoch(data().train);
    return stacked(t.params(), t.model().param_names());
  };
  const auto a = run(1, {}), b = run(1, {}), other = run(2, {});
  CHECK(a == b);
  CHECK(a != other);
  // Member 0's rate is the optimizer's own: its rows match; member 1's rate differs: its rows do not.
  const auto hyper = run(1, {.learning_rate = {0.05f, 0.2f}});
  const std::ptrdiff_t kernel = 3 * 3 * 1 * 32;  // a member's Conv_0/kernel, the first tensor
  CHECK(std::vector<float>(hyper.begin(), hyper.begin() + kernel) ==
        std::vector<float>(a.begin(), a.begin() + kernel));
  CHECK(std::vector<float>(hyper.begin() + kernel, hyper.begin() + 2 * kernel) !=
        std::vector<float>(a.begin() + kernel, a.begin() + 2 * kernel));
}

TEST_CASE("trainer: bad options and data are refused by name, before any step") {
  const train::Optimizer sgd(pmap::optim::Sgd{});
  auto make = [&](train::TrainerOptions o, int devices = 2, const char* axis = "ensemble") {
    return train::Trainer(train::flax_cnn({12, 12, 1}), sgd, cpu_mesh(devices, axis), std::move(o));
  };
  CHECK_THROWS_WITH_AS(make({.members = 3}), doctest::Contains("options.members is 3; it must be a positive multiple "
                                                               "of the mesh's 2 devices"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(make({.members = 0}), doctest::Contains("options.members is 0"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(make({.members = 2, .data_parallel = true}),
                       doctest::Contains("data parallel trains one model (members 1)"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(make({.data_parallel = true, .batch_size = 63}, 2, "data"),
                       doctest::Contains("options.batch_size is 63; it must be positive and a multiple of the "
                                         "mesh's 2"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make({.members = 2, .batch_size = 0}), doctest::Contains("options.batch_size is 0"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make({.members = 2, .report_every = -1}), doctest::Contains("options.report_every is -1"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make({.members = 2, .hyperparams = {.learning_rate = {0.1f}}}),
                       doctest::Contains("options.hyperparams.learning_rate has 1 values for 2 members"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(make({.members = 2, .hyperparams = {.weight_decay = {0.1f, 0.2f}}}),
                       doctest::Contains("has no per-member hyper-parameter 'weight_decay'"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::Trainer(train::flax_cnn({12, 12, 1}), sgd,
                                      pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2),
                                                 {{"ensemble", 1}, {"model", 2}}),
                                      {.members = 2}),
                       doctest::Contains("has several axes"), pmap::ValueError);

  train::Trainer t = make({.members = 2, .batch_size = 64});
  const auto before = stacked(t.params(), t.model().param_names());
  train::Dataset wrong_shape = pmap::testing::synthetic_dataset(640, 14, 1);
  CHECK_THROWS_WITH_AS(t.run_epoch(wrong_shape), doctest::Contains("the data's images are (14, 14); model 'flax-cnn' "
                                                                   "takes (12, 12, 1)"), pmap::ValueError);
  train::Dataset small = pmap::testing::synthetic_dataset(63, 12, 1);
  CHECK_THROWS_WITH_AS(t.run_epoch(small),
                       doctest::Contains("63 examples, fewer than one batch (options.batch_size 64)"),
                       pmap::ValueError);
  train::Dataset bad_label = pmap::testing::synthetic_dataset(640, 12, 1);
  bad_label.labels[17] = 10;
  CHECK_THROWS_WITH_AS(t.run_epoch(bad_label), doctest::Contains("label 10 of example 17 is not below model "
                                                                 "'flax-cnn''s 10 classes"), pmap::ValueError);
  CHECK(t.step() == 0);
  CHECK(t.epochs_done() == 0);
  CHECK(stacked(t.params(), t.model().param_names()) == before);
}

TEST_CASE("trainer on GPUs: an ensemble trains as the runner's Trainer on the same GPUs, its losses read once") {
  PMAPCC_REQUIRE_GPU();
  // report_every 0 picks 16 on GPUs: the epoch's 10 steps are read at its end, and on_step still sees each.
  pe::TrainConfig c = pmap::testing::small_config(2, 4);
  c.backend = pmap::DeviceKind::cuda;
  pe::Trainer old(c, data().train, data().test);
  train::Trainer now(train::flax_cnn({12, 12, 1}),
                     train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
                     pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cuda, 2), "ensemble"),
                     {.members = 4, .batch_size = 64});
  CHECK(now.options().report_every == 16);
  Reports r;
  old.run_epoch([&](const pe::StepReport& s) { r.old.push_back(s); });
  now.run_epoch(data().train, [&](const train::StepReport& s) { r.now.push_back(s); });
  REQUIRE(r.now.size() == r.old.size());
  for (std::size_t i = 0; i < r.old.size(); ++i)
    CHECK(r.now[i].loss == doctest::Approx(r.old[i].loss).epsilon(1e-5));
  const float diff = pmap::testing::max_abs_diff(stacked(now.params(), now.model().param_names()), old.params());
  MESSAGE("max |parameter difference| from the runner on the GPU after an epoch: " << diff);
  CHECK(diff <= 1e-5f);  // the products' sums may run in another order than the runner's
}
