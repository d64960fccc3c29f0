// The parts of the program's run around train::Trainer (examples/mnist_ensemble/run_parts.h): the configuration
// its files record (the mesh's devices and axes, the members, the report interval, a cosine's steps and the
// model's architecture resolved from the flags), an epoch's metrics from the Trainer's report and evaluation,
// early stopping's records, the checkpoint's own entries (the flags, the history) and the checks of a resumed
// run, on the Trainer's files and on a file the runner (the training layer before train::Trainer) wrote.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/io/metrics.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/recipe.h"
#include "examples/mnist_ensemble/run_checks.h"
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

// The resolved configuration `r` of `c` on `mesh` (CPU devices of this process), training on `fit`: the fields
// resolved_config fills in, computed here, and every other field as `c` gives it.
void check_resolution(const pe::TrainConfig& r, const pe::TrainConfig& c, const pmap::Mesh& mesh,
                      const pe::Dataset& fit) {
  pe::TrainConfig e = c;
  // From the flags: --mesh AxM as given, else every device along the mode's axis (model parallel: along
  // "model"); the mesh only to check that it has those devices.
  const int devices = c.mesh_axis > 0 ? c.mesh_axis * c.mesh_model : c.devices;
  const int along = c.mesh_axis > 0 ? c.mesh_axis : c.mode == pe::Mode::model_parallel ? 1 : c.devices;
  REQUIRE(mesh.size() == devices);
  e.architecture = {"(12, 12, 1)"};  // the data's images, then the model's modules as its summary lists them
  if (c.model == "flax-cnn")
    for (const char* m : {"Conv_0=Conv2D(32, 3x3, relu)", "Conv_1=Conv2D(64, 3x3, relu)", "Dense_0=Dense(256, relu)",
                          "Dense_1=Dense(10)"})
      e.architecture.push_back(m);
  else
    e.architecture = pe::recipe_model(c, fit).architecture();  // keras-convnet's: the literal case below
  e.devices = devices;
  e.mesh_axis = along;
  e.mesh_model = devices / along;
  e.processes = 1;
  if (c.members == 0) e.members = c.mode == pe::Mode::ensemble ? along : 1;  // one per device along the axis
  if (c.report_every == 0) e.report_every = 1;                                 // on CPU devices
  pe::Schedule& s = e.optimizer.schedule;
  if (s.kind == pmap::kernels::ScheduleKind::cosine && s.decay_steps == 0)  // the run's steps after the warmup
    s.decay_steps = static_cast<std::int64_t>(c.epochs) * (fit.count / c.batch_size) - s.warmup_steps;
  CHECK(r.architecture == e.architecture);
  CHECK(r.devices == e.devices);
  CHECK(r.mesh_axis == e.mesh_axis);
  CHECK(r.members == e.members);
  CHECK(r.report_every == e.report_every);
  CHECK(r.optimizer.schedule.decay_steps == s.decay_steps);
  CHECK(pmap::io::dump_json(r.to_json()) == pmap::io::dump_json(e.to_json()));
}

}  // namespace

TEST_CASE("program run: the resolved configuration: the mesh, the members, the report interval, a cosine's steps") {
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
  held.report_every = 3;
  configs.push_back(held);
  for (const pe::TrainConfig& c : configs) {
    CAPTURE(pmap::io::dump_json(c.to_json()));
    const pmap::Mesh mesh = pe::build_mesh(c, pe::MeshAxes::one_axis);
    const pe::TrainConfig r = pe::resolved_config(c, mesh, fit_set(c), data().test);
    check_resolution(r, c, mesh, fit_set(c));
  }
  CHECK(pe::resolved_config(cosine, pe::build_mesh(cosine, pe::MeshAxes::one_axis), data().train, data().test)
            .optimizer.schedule.decay_steps == 3 * 10 - 4);
  // A mesh of two axes (weights split over "model"): the mode's axis, then "model".
  for (const auto& [mode, along, model] : {std::tuple{pe::Mode::ensemble, 2, 1}, std::tuple{pe::Mode::ensemble, 1, 2},
                                           std::tuple{pe::Mode::model_parallel, 2, 2}}) {
    pe::TrainConfig grid = pmap::testing::small_config(along * model, mode == pe::Mode::ensemble ? 2 : 1, 1);
    grid.mode = mode;
    grid.mesh_axis = along;
    grid.mesh_model = model;
    CAPTURE(pmap::io::dump_json(grid.to_json()));
    const pmap::Mesh mesh = pe::build_mesh(grid);
    REQUIRE(mesh.axes().size() == 2);
    const pe::TrainConfig r = pe::resolved_config(grid, mesh, data().train, data().test);
    check_resolution(r, grid, mesh, data().train);
    CHECK(r.mesh_model == model);
  }
  pe::TrainConfig three = pmap::testing::small_config(2, 2, 1);
  CHECK_THROWS_WITH_AS(pe::resolved_config(three, pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2),
                                                            {{"ensemble", 1}, {"model", 2}, {"pipe", 1}}),
                                           data().train, data().test),
                       "resolved_config: a mesh of one or two axes, got 3", pmap::ValueError);
  // Flags that cannot run are refused, naming the flag.
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

TEST_CASE("program run: an epoch's metrics, a checkpoint's history and recipe on resume, the runner's file too") {
  const pe::TrainConfig c = pmap::testing::small_config(2, 2, 2);
  const pe::TrainConfig r = pe::resolved_config(c, pe::build_mesh(c, pe::MeshAxes::one_axis), data().train,
                                                data().test);
  auto now = new_trainer(r);
  const train::EpochReport report = now->run_epoch(data().train);
  const train::Evaluation evaluation = now->evaluate(data().test);
  const pe::EpochMetrics m = pe::epoch_metrics(&report, evaluation, "test", 0.25);
  CHECK(m.epoch == 1);
  CHECK(m.train_loss == report.train_loss);
  CHECK(m.train_accuracy == report.train_accuracy);
  CHECK(m.member_test_accuracy == evaluation.member_accuracy);
  CHECK(m.ensemble_test_accuracy == evaluation.ensemble_accuracy);
  CHECK(m.test_loss == evaluation.loss);
  REQUIRE(m.member_calibration.size() == 2);
  CHECK(m.member_calibration[1].nll == evaluation.member_calibration[1].nll);
  CHECK(m.ensemble_calibration.ece == evaluation.ensemble_calibration.ece);
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
  // A run of another recipe is refused before the load, naming the field.
  pe::TrainConfig other = c;
  other.optimizer.learning_rate = {0.05f};
  const pe::TrainConfig ro = pe::resolved_config(other, pe::build_mesh(other, pe::MeshAxes::one_axis), data().train,
                                                 data().test);
  CHECK_THROWS_WITH_AS(pe::check_resume(dir / "one.safetensors", ro),
                       doctest::Contains("written with lr = 0.1, this run has 0.05"), pmap::DataError);
  // A Trainer file without a program's configuration: Trainer::load's own checks only.
  now->save(dir / "bare.safetensors");
  CHECK_NOTHROW(pe::check_resume(dir / "bare.safetensors", ro));
  CHECK(pe::is_main_process(now->mesh()));

  // A file the runner wrote (tests/data/runner: --model flax-cnn --devices 1 --members 2 --lr 0.1,0.05
  // --batch-size 32 --seed 5, one epoch on 256 training images of 4x4): the same flags resume it, other ones are
  // refused naming the field, and its history is the runner's first epoch (its .history.json's).
  const std::filesystem::path runs = std::filesystem::path(PMAPCC_SOURCE_DIR) / "tests" / "data" / "runner";
  const std::filesystem::path runner = runs / "flax_cnn_ensemble.safetensors";
  const pe::Dataset tiny = pmap::testing::synthetic_dataset(256, 4, 1);
  const pe::Dataset tiny_test = pmap::testing::synthetic_dataset(100, 4, 2);
  pe::TrainConfig flags = pmap::testing::small_config(1, 2, 2);
  flags.batch_size = 32;
  flags.seed = 5;
  flags.optimizer.learning_rate = {0.1f, 0.05f};
  const pe::TrainConfig rr = pe::resolved_config(flags, pe::build_mesh(flags, pe::MeshAxes::one_axis), tiny,
                                                 tiny_test);
  CHECK_NOTHROW(pe::check_resume(runner, rr));
  flags.optimizer.learning_rate = {0.05f};
  const pe::TrainConfig rother = pe::resolved_config(flags, pe::build_mesh(flags, pe::MeshAxes::one_axis), tiny,
                                                     tiny_test);
  CHECK_THROWS_WITH_AS(pe::check_resume(runner, rother),
                       doctest::Contains("flax_cnn_ensemble.safetensors: the checkpoint was written with lr = "),
                       pmap::DataError);
  train::Trainer from_runner(pe::recipe_model(rr, tiny), pe::recipe_optimizer(rr.optimizer, 2, 2 * 8),
                             pe::build_mesh(rr, pe::MeshAxes::one_axis), pe::recipe_options(rr, 2));
  const train::Checkpoint rk = from_runner.load(runner);
  CHECK(from_runner.epochs_done() == 1);
  const auto runner_history = pe::resumed_history(runner, rk, 256, 8, from_runner.step(), 1);
  REQUIRE(runner_history.size() == 1);
  std::ifstream saved_file(runs / "flax_cnn_ensemble.history.json");
  REQUIRE(saved_file.good());
  const pmap::io::Json saved = pmap::io::Json::parse(saved_file).at(0);
  CHECK(runner_history[0].epoch == 1);
  CHECK(runner_history[0].train_loss == saved.at("train_loss").get<double>());
  CHECK(runner_history[0].test_loss == saved.at("test_loss").get<double>());
  CHECK(runner_history[0].member_test_accuracy == saved.at("member_test_accuracy").get<std::vector<double>>());
  CHECK(runner_history[0].ensemble_test_accuracy == saved.at("ensemble_test_accuracy").get<double>());
}

TEST_CASE("program run: early stopping's records before the first epoch and after, as JSON") {
  pe::TrainConfig c = pmap::testing::small_config(2, 2, 0);
  c.validation_split = 0.2;
  c.patience = 1;
  // --epochs 0: a record of no epoch per member, its best NLL none (not 0, which would read as a perfect model).
  train::EarlyStopping stop(1);
  const auto none = pe::stopping_records(stop, 2);
  REQUIRE(none.size() == 2);
  CHECK(none[1].best_epoch == 0);
  CHECK(pmap::io::dump_json(pe::early_stopping_json(none)) ==
        "[{\"member\":0,\"best_epoch\":0,\"best_validation_nll\":null,\"stopped_epoch\":null},"
        "{\"member\":1,\"best_epoch\":0,\"best_validation_nll\":null,\"stopped_epoch\":null}]");
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

TEST_CASE("program run: the program's Trainer checkpoint resumes as the straight run, and split over 'model'") {
  // An epoch on train::Trainer, saved as the program saves it (clipped: the optimizer's state in a chain,
  // "opt/1/..."), resumed as the program resumes it: the run's checks, the load, the history, the next epoch.
  for (const char* optimizer : {"sgd", "adam"}) {
    CAPTURE(optimizer);
    pe::TrainConfig c = pmap::testing::small_config(2, 2, 2);
    c.optimizer.name = optimizer;
    if (std::string(optimizer) == "adam") c.optimizer.learning_rate = {1e-3f};
    c.optimizer.clip_norm = 1.0f;
    const pe::TrainConfig r = pe::resolved_config(c, pe::build_mesh(c, pe::MeshAxes::one_axis), data().train,
                                                  data().test);
    auto now = new_trainer(r);
    const train::EpochReport report = now->run_epoch(data().train);
    const pe::EpochMetrics m = pe::epoch_metrics(&report, now->evaluate(data().test));
    const auto path = pmap::testing::scratch_dir("pmapcc_program_run_resume") / "one.safetensors";
    now->save(path, pe::checkpoint_metadata(r, {m}, data().train.count));
    auto straight = new_trainer(r);
    straight->run_epoch(data().train);
    straight->run_epoch(data().train);
    auto resumed = new_trainer(r);
    CHECK_NOTHROW(pe::check_resume(path, r));
    const train::Checkpoint ck = resumed->load(path);
    CHECK(resumed->epochs_done() == 1);
    const auto history = pe::resumed_history(path, ck, data().train.count, 10, resumed->step(), 1);
    REQUIRE(history.size() == 1);
    CHECK(history[0].train_loss == m.train_loss);
    resumed->run_epoch(data().train);
    CHECK(pmap::testing::stacked(resumed->params(), resumed->model().param_names()) ==
          pmap::testing::stacked(straight->params(), straight->model().param_names()));
    // On a mesh that splits the weights over 'model' (--mesh 1x2, resharded on load): it runs, from the same epoch.
    pe::TrainConfig split = c;
    split.mesh_axis = 1;
    split.mesh_model = 2;
    pmap::Mesh grid = pe::build_mesh(split);
    const pe::TrainConfig rs = pe::resolved_config(split, grid, data().train, data().test);
    CHECK_NOTHROW(pe::check_resume(path, rs));
    const train::Model model = pe::recipe_model(rs, data().train);
    train::TrainerOptions options = pe::recipe_options(rs, 2);
    options.sharding = pe::recipe_sharding(rs, model, grid.axes()).sharding;
    CHECK_FALSE(options.sharding.empty());
    train::Trainer on_grid(model, pe::recipe_optimizer(rs.optimizer, 2, 2 * 10), std::move(grid), options);
    on_grid.load(path);
    CHECK(on_grid.epochs_done() == 1);
    on_grid.run_epoch(data().train);
    CHECK(on_grid.epochs_done() == 2);
  }
  // A file of another recipe is refused naming the field.
  pe::TrainConfig c = pmap::testing::small_config(2, 2, 2);
  const pe::TrainConfig r = pe::resolved_config(c, pe::build_mesh(c, pe::MeshAxes::one_axis), data().train,
                                                data().test);
  auto now = new_trainer(r);
  const auto path = pmap::testing::scratch_dir("pmapcc_program_run_resume") / "zero.safetensors";
  now->save(path, pe::checkpoint_metadata(r, {}, data().train.count));
  c.seed = 9;
  const pe::TrainConfig other = pe::resolved_config(c, pe::build_mesh(c, pe::MeshAxes::one_axis), data().train,
                                                    data().test);
  CHECK_THROWS_WITH_AS(pe::check_resume(path, other), doctest::Contains("written with seed = 0, this run has 9"),
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
