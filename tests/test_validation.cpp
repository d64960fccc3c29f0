// A validation set held out of the training set (--validation-split, train::split_validation) and early stopping
// per member (--early-stopping-patience) as the program runs them on train::Trainer: the split itself; the
// epochs trained on the rest and evaluated on the validation set (epoch_metrics records which), the test set at
// the end; a run with early stopping saved mid-run with the program's records and resumed as the unbroken run
// (check_resume, resumed_history, EarlyStopping's records), refused by a run without it; and the configuration
// errors, naming the flag.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/early_stopping.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/config.h"
#include "examples/mnist_ensemble/run_parts.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace train = pmap::train;

namespace {

using pmap::testing::small_config;
using pmap::testing::stacked;

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

std::filesystem::path temp_path(const std::string& name) {
  return pmap::testing::scratch_dir("pmapcc_validation_test") / name;
}

pmap::Mesh cpu_mesh(int devices) { return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "ensemble"); }

// The program's default recipe (flax-cnn, SGD with momentum 0.9 at 0.1, batches of 64) for `members` members on
// `devices` CPU devices, each member its own learning rate when `rates` gives them.
std::unique_ptr<train::Trainer> make_trainer(int devices, int members, const std::vector<float>& rates = {}) {
  return std::make_unique<train::Trainer>(
      train::flax_cnn({12, 12, 1}), train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}),
      cpu_mesh(devices), train::TrainerOptions{.members = members, .batch_size = 64,
                                               .hyperparams = {.learning_rate = rates}});
}

// 4 members on 2 devices, a quarter of the training set held out, early stopping with patience 1; member 2's
// learning rate is far too high, so it stops early.
pe::TrainConfig stopping_config(int epochs) {
  pe::TrainConfig c = small_config(2, 4, epochs);
  c.validation_split = 0.25;
  c.patience = 1;
  c.optimizer.learning_rate = {0.1f, 0.05f, 2.0f, 0.1f};
  return c;
}

}  // namespace

TEST_CASE("split_validation holds out round-down(count * F) examples drawn by the key, both parts in order") {
  const train::Dataset& all = data().train;  // 640 examples
  const pmap::Key k = pmap::key(7);
  const auto [rest, held] = train::split_validation(all, 0.25, k);
  CHECK(held.count == 160);
  CHECK(rest.count == 480);
  CHECK(held.rows == all.rows);
  CHECK(rest.num_classes == all.num_classes);
  // The examples at the first 160 positions of permutation(key) are held out; both keep the original order.
  const auto order = pmap::permutation(k, 640);
  std::vector<bool> in_held(640, false);
  for (int i = 0; i < 160; ++i) in_held[order[static_cast<std::size_t>(i)]] = true;
  const auto pixels = static_cast<std::size_t>(all.image_size());
  std::size_t h = 0, r = 0;
  bool same = true;
  for (std::size_t i = 0; i < 640; ++i) {
    const train::Dataset& part = in_held[i] ? held : rest;
    std::size_t& at = in_held[i] ? h : r;
    same = same && part.labels[at] == all.labels[i] &&
           std::equal(all.images.begin() + static_cast<std::ptrdiff_t>(i * pixels),
                      all.images.begin() + static_cast<std::ptrdiff_t>((i + 1) * pixels),
                      part.images.begin() + static_cast<std::ptrdiff_t>(at * pixels));
    ++at;
  }
  CHECK(same);
  CHECK(h == 160);
  CHECK(r == 480);
  // Another key holds out other examples; the same key the same ones.
  CHECK(train::split_validation(all, 0.25, pmap::key(8)).second.labels != held.labels);
  CHECK(train::split_validation(all, 0.25, k).second.images == held.images);
  CHECK_THROWS_WITH_AS(train::split_validation(all, 0.001, k), doctest::Contains("leaves no validation example"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::split_validation(all, 1.0, k),
                       doctest::Contains("--validation-split must be in (0, 1)"), pmap::ValueError);
}

TEST_CASE("with a validation split, epochs train on the rest and are evaluated on the validation set") {
  // --validation-split 0.25: 2 members on 2 devices train on the 480 examples left, 7 steps an epoch, and the
  // epoch is evaluated on the 160 held out; the test set is evaluated once, at the end.
  const auto [fit, held_out] = train::split_validation(data().train, 0.25, train::validation_key(0));
  CHECK(fit.count == 480);
  CHECK(held_out.count == 160);
  CHECK(train::steps_per_epoch(fit.count, 64) == 480 / 64);
  const auto t = make_trainer(2, 2);
  const train::EpochReport report = t->run_epoch(fit);
  CHECK(report.steps == 480 / 64);
  const train::Evaluation v = t->evaluate(held_out);
  CHECK(v.examples == 160);
  const pe::EpochMetrics m = pe::epoch_metrics(&report, v, "validation");
  CHECK(m.evaluated_on == "validation");
  CHECK(m.member_test_accuracy == v.member_accuracy);
  // The epoch's numbers are the members' on the validation set, bit for bit: the saved members, evaluated by
  // another Trainer, give them.
  const auto path = temp_path("validated.safetensors");
  t->save(path);
  const train::SavedMembers saved = train::read_members(path, t->model());
  const auto other = make_trainer(2, 2);
  other->set_members(saved.params, saved.state, {0, 1});
  const train::Evaluation again = other->evaluate(held_out);
  CHECK(again.member_accuracy == v.member_accuracy);
  CHECK(again.ensemble_calibration.nll == v.ensemble_calibration.nll);
  // The test set's numbers are another set's.
  const train::Evaluation test = t->evaluate(data().test);
  CHECK(test.examples == 200);
  CHECK(pe::epoch_metrics(nullptr, test).evaluated_on == "test");
  CHECK(other->evaluate(data().test).member_accuracy == test.member_accuracy);
  // Without a split: the whole training set, 10 steps.
  CHECK(make_trainer(2, 2)->run_epoch(data().train).steps == 640 / 64);
}

TEST_CASE("early stopping resumes exactly from a checkpoint the program wrote mid-run") {
  // --validation-split 0.25 --early-stopping-patience 1, 4 epochs, as the program runs them: each epoch
  // evaluated by the EarlyStopping on the validation set; the checkpoint holds the resolved flags and the
  // history (checkpoint_metadata) and the records and best members (EarlyStopping::save_to).
  const pe::TrainConfig c = stopping_config(4);
  const auto [fit, held_out] = train::split_validation(data().train, 0.25, train::validation_key(c.seed));
  const pe::TrainConfig resolved = pe::resolved_config(c, cpu_mesh(2), fit, data().test);
  const std::int64_t steps = train::steps_per_epoch(fit.count, c.batch_size);
  struct Run {
    std::unique_ptr<train::Trainer> trainer;
    train::EarlyStopping stop{1};
    std::vector<pe::EpochMetrics> history;
  };
  auto start = [&] {
    Run r;
    r.trainer = make_trainer(2, 4, c.optimizer.learning_rate);
    return r;
  };
  auto epochs = [&](Run& r, int last) {
    while (r.trainer->epochs_done() < last && !r.stop.all_stopped()) {
      const train::EpochReport e = r.trainer->run_epoch(fit);
      r.history.push_back(pe::epoch_metrics(&e, r.stop.end_epoch(*r.trainer, held_out), "validation"));
    }
  };
  Run straight = start();
  epochs(straight, 4);
  straight.stop.restore_best(*straight.trainer);
  const auto path = temp_path("stopping.safetensors");
  {
    Run first = start();
    epochs(first, 2);
    std::map<std::string, std::string> metadata = pe::checkpoint_metadata(resolved, first.history, fit.count);
    train::Variables tensors;
    first.stop.save_to(metadata, tensors);
    first.trainer->save(path, metadata, tensors);
  }
  Run resumed = start();
  CHECK_NOTHROW(pe::check_resume(path, resolved));
  const train::Checkpoint ck = resumed.trainer->load(path, {"best/"});
  resumed.history = pe::resumed_history(path, ck, fit.count, steps, resumed.trainer->step(),
                                        resumed.trainer->epochs_done());
  resumed.stop.restore(ck, *resumed.trainer, path.string());
  CHECK(resumed.trainer->epochs_done() == 2);
  REQUIRE(resumed.history.size() == 2);
  CHECK(resumed.history[1].member_test_accuracy == straight.history[1].member_test_accuracy);
  CHECK(resumed.history[1].evaluated_on == "validation");
  epochs(resumed, 4);
  resumed.stop.restore_best(*resumed.trainer);
  const train::Model& model = straight.trainer->model();
  CHECK(stacked(resumed.trainer->params(), model.param_names()) ==
        stacked(straight.trainer->params(), model.param_names()));
  CHECK(stacked(resumed.trainer->model_state(), model.state_names()) ==
        stacked(straight.trainer->model_state(), model.state_names()));
  REQUIRE(resumed.stop.members().size() == 4);
  REQUIRE(straight.stop.members().size() == 4);
  for (std::size_t g = 0; g < 4; ++g) {
    CAPTURE(g);
    CHECK(resumed.stop.members()[g].best_epoch == straight.stop.members()[g].best_epoch);
    CHECK(resumed.stop.members()[g].stopped_epoch == straight.stop.members()[g].stopped_epoch);
    CHECK(resumed.stop.members()[g].wait == straight.stop.members()[g].wait);
  }
  REQUIRE(resumed.history.size() == straight.history.size());
  CHECK(resumed.history.back().member_test_accuracy == straight.history.back().member_test_accuracy);
  // A run without early stopping cannot resume it.
  pe::TrainConfig without = stopping_config(4);
  without.patience = 0;
  CHECK_THROWS_WITH_AS(pe::check_resume(path, pe::resolved_config(without, cpu_mesh(2), fit, data().test)),
                       doctest::Contains("early_stopping_patience"), pmap::DataError);
}

TEST_CASE("validation and early stopping settings are checked, naming the flag") {
  // The flags resolved for a run on the training set left after the split (the program's resolved_config).
  auto resolve = [](const pe::TrainConfig& c, const train::Dataset& fit) {
    return pe::resolved_config(c, cpu_mesh(1), fit, data().test);
  };
  pe::TrainConfig c = small_config(1, 1);
  c.validation_split = 1.0;
  CHECK_THROWS_WITH_AS(resolve(c, data().train), doctest::Contains("--validation-split must be in [0, 1)"),
                       pmap::ValueError);
  c.validation_split = -0.1;
  CHECK_THROWS_AS(resolve(c, data().train), pmap::ValueError);
  c.validation_split = 0;
  c.patience = 2;
  CHECK_THROWS_WITH_AS(resolve(c, data().train), doctest::Contains("give --validation-split too"), pmap::ValueError);
  c.patience = -1;
  CHECK_THROWS_WITH_AS(resolve(c, data().train), doctest::Contains("--early-stopping-patience must be >= 0"),
                       pmap::ValueError);
  c.patience = 0;
  c.validation_split = 0.95;  // 32 training examples left, batches of 64
  const train::Dataset left = train::split_validation(data().train, 0.95, train::validation_key(c.seed)).first;
  CHECK(left.count == 32);
  CHECK_THROWS_WITH_AS(resolve(c, left), doctest::Contains("see --train-limit and --validation-split"),
                       pmap::ValueError);
  c.validation_split = 0.001;  // 0.64 of an example
  CHECK_THROWS_WITH_AS(train::split_validation(data().train, c.validation_split, train::validation_key(c.seed)),
                       doctest::Contains("leaves no validation example"), pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
