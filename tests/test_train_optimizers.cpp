// train::Trainer with its optimizer as a part (pmap::optim transformations): AdamW clipped, under a warmup and a
// cosine, trains and resumes bit for bit, its moments and count included; checkpoints hold the optimizer's state
// by name and the Trainer refuses another optimizer's, the program (check_resume) another schedule or decay;
// per-member learning rates and decays give each member the run it would have had alone; a captured step
// follows the schedule as the eager step; the runner's version 1 checkpoints (SGD's momentum as "momentum/...")
// resume as its version 2, as SGD only; and optimizer flags that cannot run are refused naming the flag.
#include <doctest/doctest.h>

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/io/json.h>
#include <pmapcc/io/safetensors.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/config.h"
#include "examples/mnist_ensemble/run_parts.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace train = pmap::train;
namespace optim = pmap::optim;

namespace {

using pmap::testing::small_config;

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

std::filesystem::path temp_path(const std::string& name) {
  return pmap::testing::scratch_dir("pmapcc_optimizer_test") / name;
}

pmap::Mesh cpu_mesh(int devices, const char* axis = "ensemble") {
  return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), axis);
}

using pmap::testing::same_bits;

// Member g's rows of every tensor (host tensors (members, ...)), tensor after tensor.
std::vector<float> member_rows(const train::Variables& v, int g) {
  std::vector<float> out;
  for (const auto& [name, a] : v) {
    const auto t = a.to_vector<float>();
    const std::size_t row = t.size() / static_cast<std::size_t>(a.dim(0));
    const auto first = t.begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(g));
    out.insert(out.end(), first, first + static_cast<std::ptrdiff_t>(row));
  }
  return out;
}

// flax-cnn for training_data(), `members` members on `devices` CPU devices, batches of 64.
std::unique_ptr<train::Trainer> make_trainer(train::Optimizer tx, int devices, int members,
                                             train::MemberHyperparams hyper = {}) {
  return std::make_unique<train::Trainer>(train::flax_cnn({12, 12, 1}), std::move(tx), cpu_mesh(devices),
                                          train::TrainerOptions{.members = members, .batch_size = 64,
                                                                .hyperparams = std::move(hyper)});
}

// The program's flags resolved for a run on training_data() (a one-axis mesh of the config's devices).
pe::TrainConfig resolve(const pe::TrainConfig& c) {
  return pe::resolved_config(c, cpu_mesh(c.devices, c.mode == pe::Mode::ensemble ? "ensemble" : "data"),
                             data().train, data().test);
}

// AdamW at 3e-3 with its default decay, 3 steps of warmup, a cosine to 0.1 over the rest of 2 epochs of 10 steps,
// and each member's gradients clipped to norm 1: every part of the optimizer at once. As the program's flags:
pe::TrainConfig adamw_config(int devices, int members, int epochs) {
  pe::TrainConfig c = small_config(devices, members, epochs);
  c.optimizer.name = "adamw";
  c.optimizer.learning_rate = {3e-3f};
  c.optimizer.schedule = pe::parse_schedule("cosine:0.1");
  c.optimizer.schedule.warmup_steps = 3;
  c.optimizer.clip_norm = 1.0f;
  return c;
}
// ... and as the transformation.
train::Optimizer adamw() {
  return train::Optimizer(optim::chain(
      optim::clip_by_global_norm(1.0f),
      optim::AdamW{.learning_rate = optim::cosine_decay_schedule(
                       3e-3f, {.decay_steps = 2 * 10 - 3, .alpha = 0.1, .warmup_steps = 3})}));
}

train::Optimizer sgd(float lr = 0.1f, float weight_decay = 0.0f) {
  return train::Optimizer(optim::Sgd{.learning_rate = lr, .momentum = 0.9f, .weight_decay = weight_decay});
}

}  // namespace

TEST_CASE("adamw with warmup, cosine decay and clipping trains, and resumes bit for bit with its moments") {
  const auto path = temp_path("adamw.safetensors");
  // The program's cosine decays over the run's steps after the warmup.
  const pe::TrainConfig resolved = resolve(adamw_config(2, 2, 2));
  CHECK(resolved.optimizer.schedule.decay_steps == 2 * 10 - 3);
  const auto straight = make_trainer(adamw(), 2, 2);
  const train::EpochReport first = straight->run_epoch(data().train);
  const train::EpochReport second = straight->run_epoch(data().train);
  CHECK(second.train_loss < first.train_loss);
  {
    const auto half = make_trainer(adamw(), 2, 2);
    half->run_epoch(data().train);
    half->save(path, pe::checkpoint_metadata(resolved, {}, data().train.count));
  }
  const auto resumed = make_trainer(adamw(), 2, 2);
  resumed->load(path);
  resumed->run_epoch(data().train);
  CHECK(same_bits(resumed->params(), straight->params()));
  CHECK(same_bits(resumed->optimizer_state(), straight->optimizer_state()));
  CHECK(resumed->step() == 20);
  // The optimizer's state by name: the chain's AdamW (its transformation 1) keeps mu and nu for every parameter,
  // and its count; the clipping keeps nothing.
  const train::Variables opt = straight->optimizer_state();
  const std::vector<std::string> names = straight->model().param_names();
  CHECK(opt.size() == 2 * names.size() + 1);
  for (const std::string& n : names) {
    CAPTURE(n);
    CHECK(opt.count("1/mu/" + n) == 1);
    CHECK(opt.count("1/nu/" + n) == 1);
  }
  CHECK(opt.count("1/count") == 1);
  // The file names every variable by its role; the program's record names the optimizer's settings.
  const pmap::io::SafetensorsFile f = pmap::io::load_safetensors(path);
  CHECK(f.find("params/Conv_0/kernel") != nullptr);
  CHECK(f.find("opt/1/mu/Dense_1/bias") != nullptr);
  CHECK(f.find("opt/1/nu/Dense_1/bias") != nullptr);
  CHECK(f.find("opt/trace/Dense_1/bias") == nullptr);
  CHECK(f.metadata.at("format") == "pmapcc.train.v1");
  CHECK(f.metadata.at("optimizer") == "optim::chain");
  const pmap::io::Json config = f.metadata_json("config");
  CHECK(config["optimizer"] == "adamw");
  CHECK(config["lr_schedule"] == "cosine:0.1");
  CHECK(config["warmup_steps"] == 3);
  CHECK(config["weight_decay"].get<double>() == doctest::Approx(0.004));
}

TEST_CASE("a checkpoint of another optimizer is refused, and the program refuses another schedule or decay") {
  const auto path = temp_path("sgd.safetensors");
  {
    const auto t = make_trainer(sgd(), 1, 1);
    t->run_epoch(data().train);
    t->save(path, pe::checkpoint_metadata(resolve(small_config(1, 1)), {}, data().train.count));
  }
  // The Trainer: the optimizer's class, before anything changes.
  const auto adam = make_trainer(train::Optimizer(optim::Adam{.learning_rate = 1e-3f}), 1, 1);
  CHECK_THROWS_WITH_AS(adam->load(path),
                       doctest::Contains("the checkpoint was trained with optim::Sgd, this Trainer with optim::Adam"),
                       pmap::DataError);
  // The program: every setting its flags record, against the resumed run's.
  pe::TrainConfig c = small_config(1, 1);
  c.optimizer.name = "adam";
  CHECK_THROWS_WITH_AS(pe::check_resume(path, resolve(c)),
                       doctest::Contains("optimizer = \"sgd\", this run has \"adam\""), pmap::DataError);
  c = small_config(1, 1);
  c.optimizer.schedule = pe::parse_schedule("cosine");
  CHECK_THROWS_WITH_AS(pe::check_resume(path, resolve(c)), doctest::Contains("lr_schedule"), pmap::DataError);
  c = small_config(1, 1);
  c.optimizer.weight_decay = {0.01f};
  CHECK_THROWS_WITH_AS(pe::check_resume(path, resolve(c)), doctest::Contains("weight_decay"), pmap::DataError);
  CHECK_NOTHROW(pe::check_resume(path, resolve(small_config(1, 1))));
  // An evaluation takes the parameters only: any optimizer reads them.
  const train::SavedMembers saved = train::read_members(path, adam->model(), {0});
  adam->set_members(saved.params, saved.state, {0});
  CHECK(adam->step() == 0);
  CHECK(same_bits(adam->params(), saved.params));
}

TEST_CASE("per-member learning rates and weight decays: each member trains as it would with its values for all") {
  // SGD with momentum and Keras's decoupled decay, 2 members on 2 devices: member 0 at rate 0.1 and decay 0.01,
  // member 1 at 0.03 and 0.05 (the base optimizer's 0.5 and 0.2 replaced for both); against runs that give both
  // members one member's values.
  const auto mixed =
      make_trainer(sgd(0.5f, 0.2f), 2, 2, {.learning_rate = {0.1f, 0.03f}, .weight_decay = {0.01f, 0.05f}});
  const auto first = make_trainer(sgd(0.1f, 0.01f), 2, 2), second = make_trainer(sgd(0.03f, 0.05f), 2, 2);
  mixed->run_epoch(data().train);
  first->run_epoch(data().train);
  second->run_epoch(data().train);
  const train::Variables m = mixed->params(), a = first->params(), b = second->params();
  CHECK(member_rows(m, 0) == member_rows(a, 0));
  CHECK(member_rows(m, 1) == member_rows(b, 1));
  CHECK(member_rows(m, 1) != member_rows(a, 1));
  // The program records a per-member list as a list.
  pe::TrainConfig c = small_config(2, 2);
  c.optimizer.learning_rate = {0.1f, 0.03f};
  CHECK(c.to_json()["lr"] == pmap::io::Json::array({0.1, 0.03}));
  // 4 members on 2 devices: the device holding members 2 and 3 takes their values.
  const auto four = make_trainer(sgd(), 2, 4, {.learning_rate = {0.1f, 0.1f, 0.1f, 0.03f}});
  const auto slow = make_trainer(sgd(0.03f), 2, 4);
  four->run_epoch(data().train);
  slow->run_epoch(data().train);
  CHECK(member_rows(four->params(), 3) == member_rows(slow->params(), 3));
  CHECK(member_rows(four->params(), 2) != member_rows(slow->params(), 2));
}

TEST_CASE("a captured step (the CUDA kernels run on the host) follows the schedule as the eager step does") {
  const train::Dataset train_set = pmap::testing::synthetic_dataset(320, 12, 1);  // 5 steps
  // AdamW, one step of warmup, then a piecewise schedule: four rates (0, 1, 0.5, 0.25 x 3e-3) in five steps,
  // computed on the device from the count; with graphs (captured once, launched after) and without. Clipped
  // too: clipping by each member's norm updates the members one by one and stacks their updates, and in the
  // host run those copies wait for the host (on a GPU they are queued), so that step replays without a graph,
  // the refusal named, with the same bits.
  auto run = [&](bool graphs, bool clipped) {
    const optim::AdamW adamw{.learning_rate = optim::piecewise_schedule(
                                 3e-3f, {.boundaries = {1, 2}, .factors = {0.5, 0.25}, .warmup_steps = 1})};
    const train::Optimizer tx = clipped ? train::Optimizer(optim::chain(optim::clip_by_global_norm(1.0f), adamw))
                                        : train::Optimizer(adamw);
    auto t = std::make_unique<train::Trainer>(
        train::flax_cnn({12, 12, 1}), tx, cpu_mesh(1),
        train::TrainerOptions{.members = 2, .batch_size = 64, .cpu_backend = &pmap::kernels::cuda_backend_on_host(),
                              .graphs = graphs});
    t->run_epoch(train_set);
    return t;
  };
  for (const bool clipped : {false, true}) {
    CAPTURE(clipped);
    const auto g = run(true, clipped), e = run(false, clipped);
    CHECK(same_bits(g->params(), e->params()));
    CHECK(same_bits(g->optimizer_state(), e->optimizer_state()));
    CHECK(g->step() == 5);
    const pmap::JitStats stats = g->train_step().stats();
    INFO("graph refusal: ", stats.graph_refusal);
    if (!clipped) {
      CHECK(stats.graph_launches >= 1);  // the steps after the capture were graph launches
    } else {
      CHECK(stats.graph_launches == 0);
      CHECK(stats.graph_refusal.find("a blocking copy synchronizes with the host") != std::string::npos);
    }
    CHECK(e->train_step().stats().graph_captures == 0);
  }
}

TEST_CASE("version 1 checkpoints of the runner (momentum/<tensor>, no optimizer fields) resume as its version 2") {
  // A checkpoint the runner wrote (tests/data/runner/README.md: flax-cnn on 4x4 images, 2 members at rates 0.1
  // and 0.05, SGD with momentum 0.9, seed 5, batches of 32), and the same as the runner's version before its
  // optimizers were parts wrote it.
  const std::filesystem::path v2 =
      std::filesystem::path(PMAPCC_SOURCE_DIR) / "tests" / "data" / "runner" / "flax_cnn_ensemble.safetensors";
  const auto v1 = temp_path("v1.safetensors");
  pmap::io::SafetensorsFile f = pmap::io::load_safetensors(v2);
  REQUIRE(f.metadata.at("format") == "pmapcc.ensemble.v2");
  int renamed = 0;
  for (auto& t : f.tensors)
    if (t.name.starts_with("opt/momentum/")) {
      t.name = "momentum/" + t.name.substr(13);
      ++renamed;
    }
  CHECK(renamed == static_cast<int>(train::flax_cnn({4, 4, 1}).param_names().size()));
  pmap::io::Json config = f.metadata_json("config");
  for (const char* field : {"optimizer", "nesterov", "weight_decay", "clip_norm", "lr_schedule", "warmup_steps"})
    config.erase(field);
  f.metadata["config"] = pmap::io::dump_json(config);
  f.metadata["format"] = "pmapcc.ensemble.v1";
  pmap::io::save_safetensors(v1, f.tensors, f.metadata);
  auto make = [](train::Optimizer tx) {
    return std::make_unique<train::Trainer>(
        train::flax_cnn({4, 4, 1}), std::move(tx), cpu_mesh(1),
        train::TrainerOptions{.members = 2, .batch_size = 32, .seed = 5,
                              .hyperparams = {.learning_rate = {0.1f, 0.05f}}});
  };
  const auto from_v1 = make(sgd()), from_v2 = make(sgd());
  from_v1->load(v1);
  from_v2->load(v2);
  CHECK(from_v1->epochs_done() == 1);
  CHECK(from_v1->step() == from_v2->step());
  CHECK(same_bits(from_v1->params(), from_v2->params()));
  CHECK(same_bits(from_v1->optimizer_state(), from_v2->optimizer_state()));
  // Both continue alike (momentum included), on images of the file's size.
  const train::Dataset more = pmap::testing::synthetic_dataset(64, 4, 3);
  from_v1->run_epoch(more);
  from_v2->run_epoch(more);
  CHECK(same_bits(from_v1->params(), from_v2->params()));
  CHECK(same_bits(from_v1->optimizer_state(), from_v2->optimizer_state()));
  // ... and only as SGD.
  const auto adam = make(train::Optimizer(optim::Adam{.learning_rate = 1e-3f}));
  CHECK_THROWS_WITH_AS(adam->load(v1),
                       doctest::Contains("the checkpoint was trained with optim::Sgd, this Trainer with optim::Adam"),
                       pmap::DataError);
}

TEST_CASE("optimizer settings that cannot run are refused naming the flag") {
  // The program's flags, resolved before any Trainer is made.
  auto refused = [](const pe::TrainConfig& c, const char* why) {
    CAPTURE(why);
    CHECK_THROWS_WITH_AS(resolve(c), doctest::Contains(why), pmap::ValueError);
  };
  pe::TrainConfig c = small_config(2, 2);
  c.optimizer.name = "rmsprop";
  refused(c, "--optimizer must be one of sgd, adam, adamw, got 'rmsprop'");
  c = small_config(2, 2);
  c.optimizer.learning_rate = {0.1f, 0.2f, 0.3f};
  refused(c, "--lr gives 3 values for 2 member(s)");
  c = small_config(2, 1);
  c.mode = pe::Mode::data_parallel;
  c.optimizer.learning_rate = {0.1f, 0.2f};
  refused(c, "--lr gives 2 values for 1 member(s)");
  c = small_config(1, 1);
  c.optimizer.schedule = pe::parse_schedule("cosine");
  c.optimizer.schedule.warmup_steps = 10;  // the whole 10-step run
  refused(c, "--warmup-steps 10 leaves none of the run's 10 steps");
}

}  // namespace PMAPCC_TEST_FILE
