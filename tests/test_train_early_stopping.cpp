// train::EarlyStopping, per-member early stopping on a validation set as a part beside the Trainer's loop:
// each member stops on its own and ends at its best epoch, bit for bit as the runner's --early-stopping-patience
// (ensemble::Trainer) on the same validation split; Trainer::set_members and the errors.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/early_stopping.h>
#include <pmapcc/train/trainer.h>

#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace train = pmap::train;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

using pmap::testing::stacked;

}  // namespace

TEST_CASE("early stopping callback: each member stops on its own and ends at its best epoch, as the runner's") {
  // 4 members on 2 devices, learning rates 0.1, 0.05, 2.0 (diverges early) and 0.1, a quarter of the 640
  // examples held out, patience 1, at most 6 epochs: the runner's run and this one, epoch by epoch.
  const int epochs = 6;
  pe::TrainConfig c = pmap::testing::small_config(2, 4, epochs);
  c.validation_split = 0.25;
  c.patience = 1;
  c.optimizer.learning_rate = {0.1f, 0.05f, 2.0f, 0.1f};
  pe::Trainer old(c, data().train, data().test);
  const auto [fit, held_out] = train::split_validation(data().train, 0.25, train::validation_key(c.seed));
  CHECK(held_out.count == 160);
  train::Trainer now(train::flax_cnn({12, 12, 1}),
                     train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
                     pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "ensemble"),
                     {.members = 4, .batch_size = 64, .hyperparams = {.learning_rate = c.optimizer.learning_rate}});
  train::EarlyStopping stop(1);
  CHECK(stop.members().empty());
  while (old.epochs_done() < epochs && !old.all_stopped()) {
    CAPTURE(old.epochs_done());
    const pe::EpochMetrics m = old.run_epoch();
    now.run_epoch(fit);
    const train::Evaluation v = stop.end_epoch(now, held_out);
    REQUIRE(v.member_calibration.size() == 4);
    for (std::size_t g = 0; g < 4; ++g) {
      CAPTURE(g);
      // The runner's validation pass sums a member's NLL in other pieces: the same to rounding.
      const double a = v.member_calibration[g].nll, b = m.member_calibration[g].nll;
      CHECK(((a == doctest::Approx(b).epsilon(1e-12)) || (std::isnan(a) && std::isnan(b))));
    }
    CHECK(v.ensemble_accuracy == m.ensemble_test_accuracy);
    CHECK(stop.all_stopped() == old.all_stopped());
  }
  stop.restore_best(now);
  int stopped = 0;
  for (std::size_t g = 0; g < 4; ++g) {
    CAPTURE(g);
    const pe::MemberStopping& a = old.early_stopping()[g];
    const train::MemberStopping& b = stop.members()[g];
    CHECK(b.best_epoch == a.best_epoch);
    CHECK(b.best_nll == doctest::Approx(a.best_nll).epsilon(1e-12));
    CHECK(b.wait == a.wait);
    CHECK(b.stopped_epoch == a.stopped_epoch);
    stopped += b.stopped_epoch > 0 ? 1 : 0;
  }
  CHECK(stopped >= 2);  // members stopped early and went back to their best: the parameters below can tell
  CHECK(stacked(now.params(), now.model().param_names()) == old.params());
  CHECK(stacked(now.model_state(), now.model().state_names()) == old.model_state());
}

TEST_CASE("early stopping callback: BatchNorm's moving statistics go back to the best epoch with the parameters") {
  // keras-convnet (BatchNorm, Dropout), Adam at 1e-3 and at 0.05 (which overshoots), 2 members on 1 device.
  const int epochs = 4;
  pe::TrainConfig c = pmap::testing::small_config(1, 2, epochs);
  c.model = "keras-convnet";
  c.optimizer.name = "adam";
  c.optimizer.learning_rate = {1e-3f, 0.05f};
  c.validation_split = 0.25;
  c.patience = 1;
  pe::Trainer old(c, data().train, data().test);
  const auto [fit, held_out] = train::split_validation(data().train, 0.25, train::validation_key(c.seed));
  train::Trainer now(train::keras_convnet({12, 12, 1}), train::Optimizer(pmap::optim::Adam{.learning_rate = 1e-3f}),
                     pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "ensemble"),
                     {.members = 2, .batch_size = 64, .hyperparams = {.learning_rate = c.optimizer.learning_rate}});
  train::EarlyStopping stop(1);
  while (old.epochs_done() < epochs && !old.all_stopped()) {
    old.run_epoch();
    now.run_epoch(fit);
    stop.end_epoch(now, held_out);
  }
  stop.restore_best(now);
  int behind = 0;  // members whose best epoch is not the last one run: their restored state can tell
  for (std::size_t g = 0; g < 2; ++g) {
    CHECK(stop.members()[g].best_epoch == old.early_stopping()[g].best_epoch);
    CHECK(stop.members()[g].stopped_epoch == old.early_stopping()[g].stopped_epoch);
    behind += stop.members()[g].best_epoch < old.epochs_done() ? 1 : 0;
  }
  CHECK(behind >= 1);
  REQUIRE(!now.model().state_names().empty());
  CHECK(stacked(now.params(), now.model().param_names()) == old.params());
  CHECK(stacked(now.model_state(), now.model().state_names()) == old.model_state());
}

namespace {

struct StoppingRun {
  pe::TrainConfig config = [] {
    pe::TrainConfig c = pmap::testing::small_config(2, 4, 6);
    c.validation_split = 0.25;
    c.patience = 1;
    c.optimizer.learning_rate = {0.1f, 0.05f, 2.0f, 0.1f};
    return c;
  }();
  std::pair<train::Dataset, train::Dataset> parts =
      train::split_validation(data().train, 0.25, train::validation_key(config.seed));

  std::unique_ptr<train::Trainer> trainer(int devices) const {
    return std::make_unique<train::Trainer>(
        train::flax_cnn({12, 12, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
        pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "ensemble"),
        train::TrainerOptions{.members = 4, .batch_size = 64,
                              .hyperparams = {.learning_rate = config.optimizer.learning_rate}});
  }
  // Epochs until `last` or every member has stopped.
  void run(train::Trainer& t, train::EarlyStopping& stop, int last) const {
    while (t.epochs_done() < last && !stop.all_stopped()) {
      t.run_epoch(parts.first);
      stop.end_epoch(t, parts.second);
    }
  }
};

}  // namespace

TEST_CASE("early stopping callback: a run saved mid-way resumes exactly, on another device count, and the runner's") {
  const StoppingRun r;
  const auto straight = r.trainer(2);
  train::EarlyStopping all(1);
  r.run(*straight, all, 6);
  all.restore_best(*straight);
  const auto path = pmap::testing::scratch_dir("pmapcc_train_early_stopping_test") / "mid.safetensors";
  {
    const auto first = r.trainer(2);
    train::EarlyStopping stop(1);
    r.run(*first, stop, 2);
    std::map<std::string, std::string> meta;
    train::Variables tensors;
    stop.save_to(meta, tensors);
    CHECK(tensors.contains("best/params/Conv_0/kernel"));
    first->save(path, meta, tensors);
  }
  auto finish = [&](train::Trainer& t, const std::filesystem::path& file) {
    train::EarlyStopping stop(1);
    stop.restore(t.load(file, {"best/"}), t, file.string());
    CHECK(t.epochs_done() == 2);
    r.run(t, stop, 6);
    stop.restore_best(t);
    for (std::size_t g = 0; g < 4; ++g) {
      CAPTURE(g);
      CHECK(stop.members()[g].best_epoch == all.members()[g].best_epoch);
      CHECK(stop.members()[g].stopped_epoch == all.members()[g].stopped_epoch);
    }
    CHECK(stacked(t.params(), t.model().param_names()) == stacked(straight->params(), t.model().param_names()));
  };
  SUBCASE("written by the Trainer, continued on 1 device") { finish(*r.trainer(1), path); }
  SUBCASE("written by the runner") {
    const auto runner_path = pmap::testing::scratch_dir("pmapcc_train_early_stopping_test") / "runner.safetensors";
    pe::Trainer old(r.config, data().train, data().test);
    old.run_epoch();
    old.run_epoch();
    old.save_checkpoint(runner_path);
    finish(*r.trainer(2), runner_path);
  }
  // A file without records, and records of other members.
  const auto t = r.trainer(1);
  CHECK_THROWS_WITH_AS(train::EarlyStopping(1).restore(train::Checkpoint{}, *t, "x.safetensors"),
                       "x.safetensors: __metadata__ has no 'early_stopping' (written by a run without early "
                       "stopping)", pmap::DataError);
  CHECK_THROWS_WITH_AS(train::EarlyStopping(2).restore(t->load(path, {"best/"}), *t, "z.safetensors"),
                       "z.safetensors: the run stopped its members with patience 1; this EarlyStopping's is 2",
                       pmap::DataError);
  const train::Checkpoint three{{{"early_stopping", R"([{"best_epoch": 0, "best_nll": null, "wait": 0,
      "stopped_epoch": 0}])"}}, {}};
  CHECK_THROWS_WITH_AS(train::EarlyStopping(1).restore(three, *t, "y.safetensors"),
                       doctest::Contains("holds 1 records; the Trainer has 4 members"), pmap::DataError);
  CHECK_THROWS_WITH_AS(t->save(path, {}, [&] {
    train::Variables v;
    v.emplace("params/x", pmap::Array(pmap::Shape{1}, pmap::DType::f32));
    return v;
  }()), "train::Trainer::save: tensor 'params/x' is under params/, where the Trainer writes its own", pmap::ValueError);
}

TEST_CASE("early stopping callback and set_members: errors") {
  CHECK_THROWS_WITH_AS(train::EarlyStopping(0), "train::EarlyStopping: patience is 0; it must be at least 1",
                       pmap::ValueError);
  auto make = [](int members) {
    return std::make_unique<train::Trainer>(
        train::flax_cnn({12, 12, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f}),
        pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 1), "ensemble"),
        train::TrainerOptions{.members = members});
  };
  auto two = make(2), three = make(3);
  train::EarlyStopping stop(2);
  stop.end_epoch(*two, data().test);
  CHECK_THROWS_WITH_AS(stop.end_epoch(*three, data().test),
                       "train::EarlyStopping::end_epoch: the Trainer has 3 members; this EarlyStopping keeps the "
                       "records of 2", pmap::ValueError);
  // set_members: member 1 takes the other Trainer's member 1, member 0 keeps its own.
  auto other = make(2);
  other->run_epoch(data().train);
  const train::Variables before = two->params();
  two->set_members(other->params(), other->model_state(), {1});
  const train::Variables after = two->params();
  for (const auto& [name, a] : after) {
    CAPTURE(name);
    const std::int64_t row = a.size() / 2;
    const auto mine = a.to_vector<float>(), was = before.at(name).to_vector<float>(),
               theirs = other->params().at(name).to_vector<float>();
    CHECK(std::equal(mine.begin(), mine.begin() + row, was.begin()));
    CHECK(std::equal(mine.begin() + row, mine.end(), theirs.begin() + row));
  }
  CHECK_THROWS_WITH_AS(two->set_members(other->params(), other->model_state(), {2}),
                       "train::Trainer::set_members: member 2 is not among the 2 members", pmap::ValueError);
  train::Variables missing = other->params();
  missing.erase("Dense_1/bias");
  CHECK_THROWS_WITH_AS(two->set_members(missing, other->model_state(), {0}),
                       "train::Trainer::set_members: params has no tensor 'Dense_1/bias'", pmap::ValueError);
  CHECK_THROWS_WITH_AS(two->set_members(three->params(), three->model_state(), {0}),
                       "train::Trainer::set_members: params tensor 'Conv_0/bias' is f32(3, 32); it must be f32(2, 32)",
                       pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
