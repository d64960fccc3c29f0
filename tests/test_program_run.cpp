// The parts of the program's run around train::Trainer (examples/mnist_ensemble/run_parts.h) give what the
// runner (ensemble::Trainer) gives: the configuration its files record, an epoch's metrics, early stopping's
// records, a checkpoint's history and the checks of a resumed run, and the members stacked for ONNX.
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/ensemble/run_checks.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/io/metrics.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/recipe.h"
#include "examples/mnist_ensemble/run_parts.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace train = pmap::train;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

// The set a run of `c` trains on: the training set, less its validation split.
pe::Dataset fit_set(const pe::TrainConfig& c) {
  if (c.validation_split == 0) return data().train;
  return train::split_validation(data().train, c.validation_split, train::validation_key(c.seed)).first;
}

// The Trainer of `c` (resolved) from the recipe, on the mesh the program builds.
std::unique_ptr<train::Trainer> new_trainer(const pe::TrainConfig& r) {
  const std::int64_t run_steps =
      static_cast<std::int64_t>(r.epochs) * train::steps_per_epoch(fit_set(r).count, r.batch_size);
  return std::make_unique<train::Trainer>(pe::recipe_model(r, data().train),
                                          pe::recipe_optimizer(r.optimizer, r.members, run_steps),
                                          pe::build_mesh(r, pe::MeshAxes::one_axis), pe::recipe_options(r, r.members));
}

// The resolved configuration `r` is the runner's `old`: every field, the architecture in the model's record
// (train::Model::architecture()), which the runner's longer record (every layer) reads as.
void check_resolution(const pe::TrainConfig& r, const pe::TrainConfig& old, const pe::Dataset& data) {
  CHECK(r.architecture == pe::recipe_model(r, data).architecture());
  CHECK_NOTHROW(pe::check_architecture("runner.safetensors", old.to_json().at("architecture"),
                                       r.to_json().at("architecture")));
  pmap::io::Json mine = r.to_json(), theirs = old.to_json();
  mine.erase("architecture");
  theirs.erase("architecture");
  CHECK(pmap::io::dump_json(mine) == pmap::io::dump_json(theirs));
}

}  // namespace

TEST_CASE("program run: the resolved configuration is the one the runner records") {
  std::vector<pe::TrainConfig> configs;
  configs.push_back(pmap::testing::small_config(2, 0, 1));  // members: one per device
  pe::TrainConfig dp = pmap::testing::small_config(2, 0, 2);
  dp.mode = pe::Mode::data_parallel;
  dp.model = "keras-convnet";
  dp.dropout = {0.3f};
  configs.push_back(dp);
  pe::TrainConfig cosine = pmap::testing::small_config(1, 2, 3);
  cosine.optimizer.schedule = pe::parse_schedule("cosine:0.1");
  cosine.optimizer.schedule.warmup_steps = 4;
  cosine.optimizer.learning_rate = {0.1f, 0.05f};
  configs.push_back(cosine);
  pe::TrainConfig held = pmap::testing::small_config(2, 4, 2);
  held.validation_split = 0.2;
  held.patience = 1;
  held.mesh_axis = 2;
  held.mesh_model = 1;
  held.optimizer.name = "adamw";
  configs.push_back(held);
  for (const pe::TrainConfig& c : configs) {
    CAPTURE(pmap::io::dump_json(c.to_json()));
    const pe::Trainer old(c, data().train, data().test);
    const pmap::Mesh mesh = pe::build_mesh(c, pe::MeshAxes::one_axis);
    const pe::TrainConfig r = pe::resolved_config(c, mesh, fit_set(c), data().test);
    check_resolution(r, old.config(), data().train);
  }
  // A mesh of two axes (weights split over "model"): the runner's resolution of the same flags.
  for (const auto& [mode, along, model] : {std::tuple{pe::Mode::ensemble, 2, 1}, std::tuple{pe::Mode::ensemble, 1, 2},
                                           std::tuple{pe::Mode::model_parallel, 2, 2}}) {
    pe::TrainConfig grid = pmap::testing::small_config(along * model, mode == pe::Mode::ensemble ? 2 : 1, 1);
    grid.mode = mode;
    grid.mesh_axis = along;
    grid.mesh_model = model;
    CAPTURE(pmap::io::dump_json(grid.to_json()));
    const pe::Trainer old(grid, data().train, data().test);
    const pe::TrainConfig r = pe::resolved_config(grid, pe::build_mesh(grid), data().train, data().test);
    check_resolution(r, old.config(), data().train);
  }
  pe::TrainConfig three = pmap::testing::small_config(2, 2, 1);
  CHECK_THROWS_WITH_AS(pe::resolved_config(three, pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2),
                                                            {{"ensemble", 1}, {"model", 2}, {"pipe", 1}}),
                                           data().train, data().test),
                       "resolved_config: a mesh of one or two axes, got 3", pmap::ValueError);
  // What the runner refuses, refused alike, naming the flag.
  pe::TrainConfig c = pmap::testing::small_config(2, 3, 1);
  const pmap::Mesh two = pe::build_mesh(c, pe::MeshAxes::one_axis);
  CHECK_THROWS_WITH_AS(pe::resolved_config(c, two, data().train, data().test),
                       doctest::Contains("--members 3 is not a multiple of --devices 2"), pmap::ValueError);
  c.members = 2;
  c.dropout = {0.2f};
  CHECK_THROWS_WITH_AS(pe::resolved_config(c, two, data().train, data().test),
                       "--dropout sets the rate of the model's Dropout layers, and flax-cnn has none",
                       pmap::ValueError);
  c.dropout = {};
  c.optimizer.schedule = pe::parse_schedule("cosine");
  c.optimizer.schedule.warmup_steps = 10;
  CHECK_THROWS_WITH_AS(pe::resolved_config(c, two, data().train, data().test),
                       "--lr-schedule cosine: --warmup-steps 10 leaves none of the run's 10 steps (--epochs 1 x 10) "
                       "for the decay", pmap::ValueError);
  c.epochs = 0;  // nothing to decay over, nothing refused
  CHECK(pe::resolved_config(c, two, data().train, data().test).optimizer.schedule.decay_steps == 1);
  c = pmap::testing::small_config(2, 2, 1);
  c.batch_size = 700;
  CHECK_THROWS_WITH_AS(pe::resolved_config(c, two, data().train, data().test),
                       "--batch-size 700 is larger than the 640 training examples (see --train-limit)",
                       pmap::ValueError);
}

TEST_CASE("program run: an epoch's metrics, the members for ONNX and a checkpoint's history are the runner's") {
  const pe::TrainConfig c = pmap::testing::small_config(2, 2, 2);
  pe::Trainer old(c, data().train, data().test);
  const pe::EpochMetrics was = old.run_epoch();
  const pe::TrainConfig r = pe::resolved_config(c, pe::build_mesh(c, pe::MeshAxes::one_axis), data().train,
                                                data().test);
  auto now = new_trainer(r);
  const train::EpochReport report = now->run_epoch(data().train);
  const pe::EpochMetrics m = pe::epoch_metrics(&report, now->evaluate(data().test), "test", 0.25);
  CHECK(m.epoch == was.epoch);
  CHECK(m.train_loss == was.train_loss);
  CHECK(m.train_accuracy == was.train_accuracy);
  CHECK(m.member_test_accuracy == was.member_test_accuracy);
  CHECK(m.ensemble_test_accuracy == was.ensemble_test_accuracy);
  CHECK(m.test_loss == doctest::Approx(was.test_loss).epsilon(1e-6));
  REQUIRE(m.member_calibration.size() == 2);
  CHECK(m.member_calibration[1].nll == doctest::Approx(was.member_calibration[1].nll).epsilon(1e-6));
  CHECK(m.ensemble_calibration.ece == doctest::Approx(was.ensemble_calibration.ece).epsilon(1e-6));
  CHECK(m.eval_seconds == 0.25);
  CHECK(m.evaluated_on == "test");
  CHECK(m.seconds == report.seconds);
  CHECK(m.model_images_per_second == report.images_per_second);
  // No training (an evaluation): the test fields only.
  const pe::EpochMetrics only = pe::epoch_metrics(nullptr, now->evaluate(data().test), "validation");
  CHECK(only.epoch == 0);
  CHECK(only.train_loss == 0);
  CHECK(only.evaluated_on == "validation");
  CHECK(only.ensemble_test_accuracy == m.ensemble_test_accuracy);

  // The program's entries in a Trainer checkpoint: its configuration and history come back on resume.
  const auto dir = pmap::testing::scratch_dir("pmapcc_program_run_test");
  now->save(dir / "one.safetensors", pe::checkpoint_metadata(r, {m}, data().train.count));
  auto again = new_trainer(r);
  pe::check_resume(dir / "one.safetensors", r);
  const train::Checkpoint ck = again->load(dir / "one.safetensors");
  const std::vector<pe::EpochMetrics> history =
      pe::resumed_history(dir / "one.safetensors", ck, data().train.count, 10, again->step(), 1);
  REQUIRE(history.size() == 1);
  CHECK(pmap::io::dump_json(pmap::io::epoch_json(history[0])) == pmap::io::dump_json(pmap::io::epoch_json(m)));
  CHECK_THROWS_WITH_AS(pe::resumed_history(dir / "one.safetensors", ck, 600, 10, again->step(), 1),
                       doctest::Contains("one.safetensors: the checkpoint was trained on 640 examples, this run "
                                         "has 600"),
                       pmap::DataError);
  CHECK_THROWS_WITH_AS(pe::resumed_history(dir / "one.safetensors", ck, 640, 9, again->step(), 1),
                       doctest::Contains("one.safetensors: step 10 does not match 1 epochs of 9 steps"),
                       pmap::DataError);
  // A run of another recipe is refused before the load, naming the field: from the Trainer's file and from
  // the runner's.
  old.save_checkpoint(dir / "runner.safetensors");
  pe::TrainConfig other = c;
  other.optimizer.learning_rate = {0.05f};
  const pe::TrainConfig ro = pe::resolved_config(other, pe::build_mesh(other, pe::MeshAxes::one_axis), data().train,
                                                 data().test);
  for (const char* file : {"one.safetensors", "runner.safetensors"})
    CHECK_THROWS_WITH_AS(pe::check_resume(dir / file, ro),
                         doctest::Contains("written with lr = 0.1, this run has 0.05"), pmap::DataError);
  CHECK_NOTHROW(pe::check_resume(dir / "runner.safetensors", r));
  // A Trainer file without a program's configuration: Trainer::load's own checks only.
  now->save(dir / "bare.safetensors");
  CHECK_NOTHROW(pe::check_resume(dir / "bare.safetensors", ro));
  // The runner's file resumed by the Trainer: its history is the runner's.
  auto from_runner = new_trainer(r);
  const train::Checkpoint rk = from_runner->load(dir / "runner.safetensors");
  const auto runner_history =
      pe::resumed_history(dir / "runner.safetensors", rk, data().train.count, 10, from_runner->step(), 1);
  REQUIRE(runner_history.size() == 1);
  CHECK(pmap::io::dump_json(pmap::io::epoch_json(runner_history[0])) ==
        pmap::io::dump_json(pmap::io::epoch_json(old.history()[0])));
  CHECK(pe::is_main_process(now->mesh()));
}

TEST_CASE("program run: early stopping's records before the first epoch and after, as the runner's JSON") {
  pe::TrainConfig c = pmap::testing::small_config(2, 2, 0);
  c.validation_split = 0.2;
  c.patience = 1;
  const pe::Trainer old(c, data().train, data().test);  // --epochs 0: a record of no epoch per member
  train::EarlyStopping stop(1);
  const auto none = pe::stopping_records(stop, 2);
  REQUIRE(none.size() == 2);
  CHECK(none[1].best_epoch == 0);
  std::vector<train::MemberStopping> runner;
  for (const pe::MemberStopping& s : old.early_stopping())
    runner.push_back({s.best_epoch, s.best_nll, s.wait, s.stopped_epoch});
  CHECK(pmap::io::dump_json(pe::early_stopping_json(none)) == pmap::io::dump_json(pe::early_stopping_json(runner)));
  // After epochs: the EarlyStopping's own records, a NaN as null and a member that stopped with its epoch.
  std::vector<train::MemberStopping> records{{2, 0.5, 0, 0}, {1, std::nan(""), 1, 2}};
  const pmap::io::Json j = pe::early_stopping_json(records);
  CHECK(pmap::io::dump_json(j) ==
        "[{\"member\":0,\"best_epoch\":2,\"best_validation_nll\":0.5,\"stopped_epoch\":null},"
        "{\"member\":1,\"best_epoch\":1,\"best_validation_nll\":null,\"stopped_epoch\":2}]");
  const pe::TrainConfig r =
      pe::resolved_config(c, pe::build_mesh(c, pe::MeshAxes::one_axis), fit_set(c), data().test);
  auto t = new_trainer(r);
  const auto split = train::split_validation(data().train, 0.2, train::validation_key(c.seed));
  t->run_epoch(split.first);
  stop.end_epoch(*t, split.second);
  CHECK(pe::stopping_records(stop, 2).size() == 2);
  CHECK(pe::stopping_records(stop, 2)[0].best_epoch == 1);
}

TEST_CASE("program run: the program's Trainer checkpoint resumes on the runner (a mesh that splits weights)") {
  // An epoch on train::Trainer, saved as the program saves it; the runner continues it as its own first epoch.
  for (const char* optimizer : {"sgd", "adam"}) {
    CAPTURE(optimizer);
    pe::TrainConfig c = pmap::testing::small_config(2, 2, 2);
    c.optimizer.name = optimizer;
    if (std::string(optimizer) == "adam") c.optimizer.learning_rate = {1e-3f};
    c.optimizer.clip_norm = 1.0f;  // the Trainer keeps the optimizer's state in a chain: "opt/1/..."
    const pe::TrainConfig r = pe::resolved_config(c, pe::build_mesh(c, pe::MeshAxes::one_axis), data().train,
                                                  data().test);
    auto now = new_trainer(r);
    const train::EpochReport report = now->run_epoch(data().train);
    const pe::EpochMetrics m = pe::epoch_metrics(&report, now->evaluate(data().test));
    const auto path = pmap::testing::scratch_dir("pmapcc_program_run_resume") / "one.safetensors";
    now->save(path, pe::checkpoint_metadata(r, {m}, data().train.count));
    pe::Trainer straight(c, data().train, data().test);
    straight.run_epoch();
    straight.run_epoch();
    pe::Trainer resumed(c, data().train, data().test);
    resumed.load_checkpoint(path);
    CHECK(resumed.epochs_done() == 1);
    REQUIRE(resumed.history().size() == 1);
    CHECK(resumed.history()[0].train_loss == m.train_loss);
    resumed.run_epoch();
    CHECK(resumed.params() == straight.params());
    // On a mesh that splits the weights over 'model' (resharded on load): it runs, from the same epoch.
    pe::TrainConfig split = c;
    split.mesh_axis = 1;
    split.mesh_model = 2;
    pe::Trainer on_grid(split, data().train, data().test);
    on_grid.load_checkpoint(path);
    CHECK(on_grid.epochs_done() == 1);
    on_grid.run_epoch();
    CHECK(on_grid.epochs_done() == 2);
  }
  // A Trainer file of another recipe is refused naming the field, as a runner file is.
  pe::TrainConfig c = pmap::testing::small_config(2, 2, 2);
  const pe::TrainConfig r = pe::resolved_config(c, pe::build_mesh(c, pe::MeshAxes::one_axis), data().train,
                                                data().test);
  auto now = new_trainer(r);
  const auto path = pmap::testing::scratch_dir("pmapcc_program_run_resume") / "zero.safetensors";
  now->save(path, pe::checkpoint_metadata(r, {}, data().train.count));
  c.seed = 9;
  pe::Trainer other(c, data().train, data().test);
  CHECK_THROWS_WITH_AS(other.load_checkpoint(path), doctest::Contains("written with seed = 0, this run has 9"),
                       pmap::DataError);
}

TEST_CASE("program run: a checkpoint's architecture, in the model's record or the runner's longer one") {
  using pmap::io::Json;
  const pe::Dataset& d = data().train;  // 12x12 images
  pe::TrainConfig c = pmap::testing::small_config(1, 1, 1);
  c.model = "keras-convnet";
  const Json now = pe::recipe_model(c, d).architecture();
  CHECK(now == Json::parse(R"j(["(12, 12, 1)", "Conv_0=Conv2D(12, 3x3, no bias)",
      "BatchNorm_0=BatchNormalization(momentum 0.99, epsilon 0.001, no scale, relu)",
      "Conv_1=Conv2D(24, 6x6, stride 2, valid, no bias)",
      "BatchNorm_1=BatchNormalization(momentum 0.99, epsilon 0.001, no scale, relu)",
      "large_k=Conv2D(32, 6x6, stride 2)",
      "BatchNorm_2=BatchNormalization(momentum 0.99, epsilon 0.001, no scale, relu)",
      "Dense_0=Dense(256, relu)", "dropout=Dropout(0.5)", "Dense_1=Dense(10)"])j"));
  CHECK_NOTHROW(pe::check_architecture("mine.safetensors", now, now));
  // What the runner recorded for keras-convnet: every layer, the ReLUs and the pooling their own.
  Json runner = Json::parse(R"j(["(12, 12, 1)", "Conv_0=Conv2D(12, 3x3, no bias)",
      "BatchNorm_0=BatchNormalization(momentum 0.99, epsilon 0.001, no scale)", "relu=ReLU",
      "Conv_1=Conv2D(24, 6x6, stride 2, valid, no bias)",
      "BatchNorm_1=BatchNormalization(momentum 0.99, epsilon 0.001, no scale)", "relu=ReLU",
      "large_k=Conv2D(32, 6x6, stride 2)", "BatchNorm_2=BatchNormalization(momentum 0.99, epsilon 0.001, no scale)",
      "relu=ReLU", "global_avg_pool=GlobalAveragePooling2D", "Dense_0=Dense(256)", "relu=ReLU",
      "dropout=Dropout(0.5)", "Dense_1=Dense(10)"])j");
  CHECK_NOTHROW(pe::check_architecture("runner.safetensors", runner, now));
  // A module that differs, a ReLU missing, another input or a module too many: refused, naming the first one.
  Json other = runner;
  other[11] = "Dense_0=Dense(128)";
  CHECK_THROWS_WITH_AS(pe::check_architecture("runner.safetensors", other, now),
                       "runner.safetensors: the checkpoint's model has layer 6 Dense_0=Dense(128, relu) where this "
                       "run's has Dense_0=Dense(256, relu) (resume with the same model)",
                       pmap::DataError);
  other = runner;
  other.erase(12);
  CHECK_THROWS_WITH_AS(pe::check_architecture("runner.safetensors", other, now),
                       doctest::Contains("layer 6 Dense_0=Dense(256) where this run's has Dense_0=Dense(256, relu)"),
                       pmap::DataError);
  other = runner;
  other[0] = "(28, 28, 1)";
  CHECK_THROWS_WITH_AS(pe::check_architecture("runner.safetensors", other, now),
                       doctest::Contains("has input (28, 28, 1) where this run's has (12, 12, 1)"), pmap::DataError);
  other = now;
  other.push_back("Dense_2=Dense(10)");
  CHECK_THROWS_WITH_AS(pe::check_architecture("mine.safetensors", other, now),
                       doctest::Contains("has layer 9 Dense_2=Dense(10) where this run's has nothing"),
                       pmap::DataError);
}

}  // namespace PMAPCC_TEST_FILE
