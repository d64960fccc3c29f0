// A validation set held out of the training set (TrainConfig::validation_split) and early stopping per member
// (TrainConfig::patience): the split itself, epochs evaluated on the validation set, each member ending at its
// best epoch's parameters, exact resume, and the configuration errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include <pmapcc/ensemble/member_layout.h>
#include <pmapcc/ensemble/trainer.h>
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

using namespace pmap::ensemble;

namespace {

using pmap::testing::small_config;

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

std::filesystem::path temp_path(const std::string& name) {
  return pmap::testing::scratch_dir("pmapcc_validation_test") / name;
}

// Member g's parameters out of a trainer's stacked params().
std::vector<float> member_params(const Trainer& t, const std::vector<float>& stacked, int g) {
  return member_block(t.model(), stacked, t.total_members(), g, 1);
}

// 4 members on 2 devices, a quarter of the training set held out, early stopping with patience 1; member 2's
// learning rate is far too high, so it stops early.
TrainConfig stopping_config(int epochs) {
  TrainConfig c = small_config(2, 4, epochs);
  c.validation_split = 0.25;
  c.patience = 1;
  c.optimizer.learning_rate = {0.1f, 0.05f, 2.0f, 0.1f};
  return c;
}

}  // namespace

TEST_CASE("split_validation holds out round-down(count * F) examples drawn by the key, both parts in order") {
  const Dataset& train = data().train;  // 640 examples
  const pmap::Key k = pmap::key(7);
  const auto [rest, held] = split_validation(train, 0.25, k);
  CHECK(held.count == 160);
  CHECK(rest.count == 480);
  CHECK(held.rows == train.rows);
  CHECK(rest.num_classes == train.num_classes);
  // The examples at the first 160 positions of permutation(key) are held out; both keep the original order.
  const auto order = pmap::permutation(k, 640);
  std::vector<bool> in_held(640, false);
  for (int i = 0; i < 160; ++i) in_held[order[static_cast<std::size_t>(i)]] = true;
  const auto pixels = static_cast<std::size_t>(train.image_size());
  std::size_t h = 0, r = 0;
  bool same = true;
  for (std::size_t i = 0; i < 640; ++i) {
    const Dataset& part = in_held[i] ? held : rest;
    std::size_t& at = in_held[i] ? h : r;
    same = same && part.labels[at] == train.labels[i] &&
           std::equal(train.images.begin() + static_cast<std::ptrdiff_t>(i * pixels),
                      train.images.begin() + static_cast<std::ptrdiff_t>((i + 1) * pixels),
                      part.images.begin() + static_cast<std::ptrdiff_t>(at * pixels));
    ++at;
  }
  CHECK(same);
  CHECK(h == 160);
  CHECK(r == 480);
  // Another key holds out other examples; the same key the same ones.
  CHECK(split_validation(train, 0.25, pmap::key(8)).second.labels != held.labels);
  CHECK(split_validation(train, 0.25, k).second.images == held.images);
  CHECK_THROWS_WITH_AS(split_validation(train, 0.001, k), doctest::Contains("leaves no validation example"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(split_validation(train, 1.0, k), doctest::Contains("--validation-split must be in (0, 1)"),
                       pmap::ValueError);
}

TEST_CASE("with a validation split, epochs are evaluated on the validation set and evaluate() on the test set") {
  TrainConfig c = small_config(2, 2, 1);
  c.validation_split = 0.25;
  Trainer t(c, data().train, data().test);
  CHECK(t.train_data().count == 480);
  CHECK(t.validation_data().count == 160);
  CHECK(t.steps_per_epoch() == 480 / 64);
  const EpochMetrics m = t.run_epoch();
  CHECK(m.evaluated_on == "validation");
  // The epoch's numbers are the members evaluated on the validation set, bit for bit.
  const auto path = temp_path("validated.safetensors");
  t.save_checkpoint(path);
  TrainConfig e = small_config(2, 2);
  e.epochs = 0;
  Trainer on_validation(e, t.validation_data(), t.validation_data());
  on_validation.load_members(path, {});
  EpochMetrics v;
  on_validation.evaluate(v);
  CHECK(v.member_test_accuracy == m.member_test_accuracy);
  CHECK(v.ensemble_calibration.nll == m.ensemble_calibration.nll);
  // evaluate() is the test set's.
  EpochMetrics test;
  t.evaluate(test);
  CHECK(test.evaluated_on == "test");
  Trainer on_test(e, data().test, data().test);
  on_test.load_members(path, {});
  EpochMetrics tt;
  on_test.evaluate(tt);
  CHECK(tt.member_test_accuracy == test.member_test_accuracy);
  // Without a split nothing changes: the test set, and the whole training set.
  Trainer plain(small_config(2, 2, 1), data().train, data().test);
  CHECK(plain.train_data().count == 640);
  CHECK(plain.validation_data().count == 0);
  CHECK(plain.run_epoch().evaluated_on == "test");
}

TEST_CASE("early stopping: each member stops on its own and ends with its best epoch's parameters") {
  const int epochs = 6;
  Trainer t(stopping_config(epochs), data().train, data().test);
  // The same run without early stopping, its parameters after every epoch.
  TrainConfig plain = stopping_config(epochs);
  plain.patience = 0;
  Trainer reference(plain, data().train, data().test);
  std::vector<std::vector<float>> after{reference.params()};  // after[e]: after e epochs
  for (int e = 0; e < epochs; ++e) {
    reference.run_epoch();
    after.push_back(reference.params());
  }
  int epochs_run = 0;
  while (t.epochs_done() < epochs && !t.all_stopped()) {
    t.run_epoch();
    ++epochs_run;
  }
  const auto& stopping = t.early_stopping();
  REQUIRE(stopping.size() == 4);
  const std::vector<float> final_params = t.params();
  int stopped_early = 0;
  for (int g = 0; g < 4; ++g) {
    CAPTURE(g);
    const MemberStopping& s = stopping[static_cast<std::size_t>(g)];
    REQUIRE(s.best_epoch >= 1);
    REQUIRE(s.best_epoch <= epochs_run);
    // Its best epoch is the one of its lowest validation NLL (the first on ties), as the history says.
    double best = INFINITY;
    int best_epoch = 0;
    const int last = s.stopped_epoch > 0 ? s.stopped_epoch : epochs_run;
    for (int e = 1; e <= last; ++e) {
      const double nll = t.history()[static_cast<std::size_t>(e - 1)].member_calibration[static_cast<std::size_t>(g)].nll;
      if (nll < best) {
        best = nll;
        best_epoch = e;
      }
    }
    CHECK(s.best_epoch == best_epoch);
    CHECK(s.best_nll == best);
    if (s.stopped_epoch > 0) {
      CHECK(s.stopped_epoch == s.best_epoch + 1);  // patience 1
      stopped_early += s.stopped_epoch < epochs;
      // After it stopped, every epoch evaluates its best parameters: its numbers stay its best epoch's.
      for (int e = s.stopped_epoch + 1; e <= epochs_run; ++e)
        CHECK(t.history()[static_cast<std::size_t>(e - 1)].member_test_accuracy[static_cast<std::size_t>(g)] ==
              t.history()[static_cast<std::size_t>(s.best_epoch - 1)].member_test_accuracy[static_cast<std::size_t>(g)]);
    }
    // Its parameters at the end are the run without early stopping's after its best epoch, bit for bit (each
    // member trains alone: the others' stops change nothing of it).
    CHECK(member_params(t, final_params, g) ==
          member_params(reference, after[static_cast<std::size_t>(s.best_epoch)], g));
  }
  CHECK(stopped_early >= 1);  // member 2's learning rate sees to it
}

TEST_CASE("early stopping resumes exactly from a checkpoint written mid-run") {
  const auto path = temp_path("stopping.safetensors");
  Trainer straight(stopping_config(4), data().train, data().test);
  for (int e = 0; e < 4; ++e) straight.run_epoch();
  {
    Trainer first(stopping_config(4), data().train, data().test);
    first.run_epoch();
    first.run_epoch();
    first.save_checkpoint(path);
  }
  Trainer resumed(stopping_config(4), data().train, data().test);
  resumed.load_checkpoint(path);
  CHECK(resumed.epochs_done() == 2);
  resumed.run_epoch();
  resumed.run_epoch();
  CHECK(resumed.params() == straight.params());
  CHECK(resumed.model_state() == straight.model_state());
  for (std::size_t g = 0; g < 4; ++g) {
    CAPTURE(g);
    CHECK(resumed.early_stopping()[g].best_epoch == straight.early_stopping()[g].best_epoch);
    CHECK(resumed.early_stopping()[g].stopped_epoch == straight.early_stopping()[g].stopped_epoch);
    CHECK(resumed.early_stopping()[g].wait == straight.early_stopping()[g].wait);
  }
  CHECK(resumed.history().back().member_test_accuracy == straight.history().back().member_test_accuracy);
  // A run without early stopping cannot resume it, nor the other way round.
  TrainConfig without = stopping_config(4);
  without.patience = 0;
  Trainer other(without, data().train, data().test);
  CHECK_THROWS_WITH_AS(other.load_checkpoint(path), doctest::Contains("early_stopping_patience"), pmap::DataError);
}

TEST_CASE("validation and early stopping settings are checked, naming the flag") {
  TrainConfig c = small_config(1, 1);
  c.validation_split = 1.0;
  CHECK_THROWS_WITH_AS(Trainer(c, data().train, data().test), doctest::Contains("--validation-split must be in [0, 1)"),
                       pmap::ValueError);
  c.validation_split = -0.1;
  CHECK_THROWS_AS(Trainer(c, data().train, data().test), pmap::ValueError);
  c.validation_split = 0;
  c.patience = 2;
  CHECK_THROWS_WITH_AS(Trainer(c, data().train, data().test), doctest::Contains("give --validation-split too"),
                       pmap::ValueError);
  c.patience = -1;
  CHECK_THROWS_WITH_AS(Trainer(c, data().train, data().test),
                       doctest::Contains("--early-stopping-patience must be >= 0"), pmap::ValueError);
  c.patience = 0;
  c.validation_split = 0.95;  // 32 training examples left, batches of 64
  CHECK_THROWS_WITH_AS(Trainer(c, data().train, data().test), doctest::Contains("see --train-limit and --validation-split"),
                       pmap::ValueError);
  c.validation_split = 0.001;  // 0.64 of an example
  CHECK_THROWS_WITH_AS(Trainer(c, data().train, data().test), doctest::Contains("leaves no validation example"),
                       pmap::ValueError);
}

}  // namespace PMAPCC_TEST_FILE
