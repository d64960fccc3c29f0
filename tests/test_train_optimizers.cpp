// The Trainer with its optimizer as a part: Adam and AdamW with schedules, clipping and weight decay train
// and resume bit for bit, checkpoints hold the optimizer's state by name and refuse another optimizer,
// per-member hyper-parameters give each member the run it would have had alone, captured steps follow a
// schedule, version 1 checkpoints (SGD's momentum as "momentum/...") still resume, and bad settings are
// refused naming the flag.
#include <doctest/doctest.h>

#include <filesystem>

#include <pmapcc/ensemble/member_layout.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/io/json.h>
#include <pmapcc/io/safetensors.h>
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

using namespace pmap::ensemble;

namespace {

using pmap::testing::small_config;

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

// AdamW 3e-3 with decay, warmup, a cosine over the run and clipping: every part of the optimizer at once.
TrainConfig adamw(int devices, int members, int epochs) {
  TrainConfig c = small_config(devices, members, epochs);
  c.optimizer.name = "adamw";
  c.optimizer.learning_rate = {3e-3f};
  c.optimizer.schedule = parse_schedule("cosine:0.1");
  c.optimizer.schedule.warmup_steps = 3;
  c.optimizer.clip_norm = 1.0f;
  return c;
}

std::filesystem::path temp_path(const std::string& name) {
  return pmap::testing::scratch_dir("pmapcc_optimizer_test") / name;
}

// Member g's parameters from a trainer's stacked ones.
std::vector<float> member(const Trainer& t, int g) {
  return member_block(t.model(), t.params(), t.total_members(), g, 1);
}

}  // namespace

TEST_CASE("adamw with warmup, cosine decay and clipping trains, and resumes bit for bit with m and v") {
  const auto path = temp_path("adamw.safetensors");
  Trainer straight(adamw(2, 2, 2), data().train, data().test);
  const EpochMetrics first = straight.run_epoch();
  const EpochMetrics second = straight.run_epoch();
  CHECK(second.train_loss < first.train_loss);
  CHECK(straight.config().optimizer.schedule.decay_steps == 2 * 10 - 3);  // the run's steps after warmup
  CHECK(straight.optimizer().slots() == std::vector<std::string>{"m", "v"});
  {
    Trainer half(adamw(2, 2, 2), data().train, data().test);
    half.run_epoch();
    half.save_checkpoint(path);
  }
  Trainer resumed(adamw(2, 2, 2), data().train, data().test);
  resumed.load_checkpoint(path);
  resumed.run_epoch();
  CHECK(resumed.params() == straight.params());
  CHECK(resumed.optimizer_state("m") == straight.optimizer_state("m"));
  CHECK(resumed.optimizer_state("v") == straight.optimizer_state("v"));
  CHECK(resumed.step() == 20);
  // The file names every variable by its role; the config records the optimizer.
  const pmap::io::SafetensorsFile f = pmap::io::load_safetensors(path);
  CHECK(f.find("params/Conv_0/kernel") != nullptr);
  CHECK(f.find("opt/m/Dense_1/bias") != nullptr);
  CHECK(f.find("opt/v/Dense_1/bias") != nullptr);
  CHECK(f.find("opt/momentum/Dense_1/bias") == nullptr);
  CHECK(f.metadata.at("format") == "pmapcc.ensemble.v2");
  const pmap::io::Json config = f.metadata_json("config");
  CHECK(config["optimizer"] == "adamw");
  CHECK(config["lr_schedule"] == "cosine:0.1");
  CHECK(config["warmup_steps"] == 3);
  CHECK(config["weight_decay"].get<double>() == doctest::Approx(0.004));
  CHECK_THROWS_WITH_AS(straight.optimizer_state("momentum"), doctest::Contains("adamw has no slot 'momentum'"),
                       pmap::ValueError);
}

TEST_CASE("a checkpoint of another optimizer, schedule or rate is refused, naming the setting") {
  const auto path = temp_path("sgd.safetensors");
  {
    Trainer sgd(small_config(1, 1), data().train, data().test);
    sgd.run_epoch();
    sgd.save_checkpoint(path);
  }
  TrainConfig adam = small_config(1, 1);
  adam.optimizer.name = "adam";
  Trainer a(adam, data().train, data().test);
  CHECK_THROWS_WITH_AS(a.load_checkpoint(path), doctest::Contains("optimizer = \"sgd\", this run has \"adam\""),
                       pmap::DataError);
  TrainConfig cosine = small_config(1, 1);
  cosine.optimizer.schedule = parse_schedule("cosine");
  Trainer c(cosine, data().train, data().test);
  CHECK_THROWS_WITH_AS(c.load_checkpoint(path), doctest::Contains("lr_schedule"), pmap::DataError);
  TrainConfig rates = small_config(1, 1);
  rates.optimizer.weight_decay = {0.01f};
  Trainer r(rates, data().train, data().test);
  CHECK_THROWS_WITH_AS(r.load_checkpoint(path), doctest::Contains("weight_decay"), pmap::DataError);
  // An evaluation takes the parameters only: any optimizer reads them.
  a.load_members(path, {0});
  CHECK(a.step() == 0);
}

TEST_CASE("per-member learning rates and weight decays: each member trains as it would with its values for all") {
  TrainConfig mixed = small_config(2, 2);
  mixed.optimizer.learning_rate = {0.1f, 0.03f};
  mixed.optimizer.weight_decay = {0.0f, 0.05f};
  TrainConfig first = small_config(2, 2), second = small_config(2, 2);
  first.optimizer.learning_rate = {0.1f};
  second.optimizer.learning_rate = {0.03f};
  second.optimizer.weight_decay = {0.05f};
  Trainer m(mixed, data().train, data().test), a(first, data().train, data().test),
      b(second, data().train, data().test);
  m.run_epoch(), a.run_epoch(), b.run_epoch();
  CHECK(member(m, 0) == member(a, 0));
  CHECK(member(m, 1) == member(b, 1));
  CHECK(member(m, 1) != member(a, 1));
  CHECK(m.config().to_json()["lr"] == pmap::io::Json::array({0.1, 0.03}));
  // 4 members on 2 devices: the device holding members 2 and 3 takes their values.
  TrainConfig four = small_config(2, 4);
  four.optimizer.learning_rate = {0.1f, 0.1f, 0.1f, 0.03f};
  TrainConfig four_b = small_config(2, 4);
  four_b.optimizer.learning_rate = {0.03f};
  Trainer f(four, data().train, data().test), fb(four_b, data().train, data().test);
  f.run_epoch(), fb.run_epoch();
  CHECK(member(f, 3) == member(fb, 3));
}

TEST_CASE("a captured step (the CUDA kernels run on the host) follows the schedule as the eager step does") {
  const Dataset train = pmap::testing::synthetic_dataset(320, 12, 1);
  TrainConfig graphs = adamw(1, 2, 1);
  graphs.optimizer.schedule = parse_schedule("piecewise:2=0.5,3=0.25");  // three rates in five steps
  graphs.cuda_kernels_on_host = true;
  TrainConfig eager = graphs;
  eager.graphs = false;
  Trainer g(graphs, train, data().test), e(eager, train, data().test);
  g.run_epoch(), e.run_epoch();
  CHECK(g.params() == e.params());
  CHECK(g.optimizer_state("v") == e.optimizer_state("v"));
  CHECK(g.step() == 5);
}

TEST_CASE("version 1 checkpoints (momentum/<tensor>, no optimizer fields) resume as SGD, bit for bit") {
  const auto v2 = temp_path("v2.safetensors"), v1 = temp_path("v1.safetensors");
  {
    Trainer t(small_config(1, 2, 2), data().train, data().test);
    t.run_epoch();
    t.save_checkpoint(v2);
  }
  // The same checkpoint as the version before optimizers were parts wrote it.
  pmap::io::SafetensorsFile f = pmap::io::load_safetensors(v2);
  for (auto& t : f.tensors)
    if (t.name.starts_with("opt/momentum/")) t.name = "momentum/" + t.name.substr(13);
  pmap::io::Json config = f.metadata_json("config");
  for (const char* field : {"optimizer", "nesterov", "weight_decay", "clip_norm", "lr_schedule", "warmup_steps"})
    config.erase(field);
  f.metadata["config"] = pmap::io::dump_json(config);
  f.metadata["format"] = "pmapcc.ensemble.v1";
  pmap::io::save_safetensors(v1, f.tensors, f.metadata);
  Trainer from_v1(small_config(1, 2, 2), data().train, data().test),
      from_v2(small_config(1, 2, 2), data().train, data().test);
  from_v1.load_checkpoint(v1);
  from_v2.load_checkpoint(v2);
  from_v1.run_epoch(), from_v2.run_epoch();
  CHECK(from_v1.params() == from_v2.params());
  CHECK(from_v1.optimizer_state("momentum") == from_v2.optimizer_state("momentum"));
  // ... and only as SGD.
  TrainConfig adam = small_config(1, 2, 2);
  adam.optimizer.name = "adam";
  Trainer a(adam, data().train, data().test);
  CHECK_THROWS_WITH_AS(a.load_checkpoint(v1), doctest::Contains("optimizer = \"sgd\""), pmap::DataError);
}

TEST_CASE("optimizer settings that cannot run are refused naming the flag") {
  auto refused = [](TrainConfig c, const char* why) {
    CAPTURE(why);
    CHECK_THROWS_WITH_AS(Trainer(c, data().train, data().test), doctest::Contains(why), pmap::ValueError);
  };
  TrainConfig c = small_config(2, 2);
  c.optimizer.name = "rmsprop";
  refused(c, "--optimizer must be one of sgd, adam, adamw, got 'rmsprop'");
  c = small_config(2, 2);
  c.optimizer.learning_rate = {0.1f, 0.2f, 0.3f};
  refused(c, "--lr gives 3 values for 2 member(s)");
  c = small_config(2, 1);
  c.mode = Mode::data_parallel;
  c.optimizer.learning_rate = {0.1f, 0.2f};
  refused(c, "--lr gives 2 values for 1 member(s)");
  c = small_config(1, 1);
  c.optimizer.schedule = parse_schedule("cosine");
  c.optimizer.schedule.warmup_steps = 10;  // the whole 10-step run
  refused(c, "--warmup-steps 10 leaves none of the run's 10 steps");
}

}  // namespace PMAPCC_TEST_FILE
