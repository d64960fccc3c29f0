// train::Trainer checkpoints: a run saved after an epoch and loaded continues bit for bit as the run that did
// not stop, on the same or another device count (an ensemble) and from fake GPUs to CPU devices; the runner's
// committed checkpoints (tests/data/runner) load with their members, optimizer slots and per-member rates;
// read_members picks members out of either; the program's inspect_checkpoint reads both; every mismatch and
// corruption is refused, naming the file and the fault, before the Trainer changes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/io/safetensors.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "cuda_testing.h"
#include "examples/mnist_ensemble/config.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace train = pmap::train;
namespace optim = pmap::optim;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

std::filesystem::path temp_path(const std::string& name) {
  return pmap::testing::scratch_dir("pmapcc_train_checkpoint_test") / name;
}

pmap::Mesh mesh(pmap::DeviceKind kind, int devices) {
  return pmap::Mesh(pmap::local_devices(kind, devices), "ensemble");
}

train::Optimizer sgd() { return train::Optimizer(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}); }

// Every tensor's bytes, by name: equal maps are the same bits.
std::map<std::string, std::vector<std::byte>> bits(const train::Variables& v) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, a] : v) {
    std::vector<std::byte> b(a.nbytes());
    if (!b.empty()) a.copy_to_host(b.data(), b.size());
    out.emplace(name, std::move(b));
  }
  return out;
}

// The Trainer's whole state on the host, for bitwise comparisons.
struct Snapshot {
  std::map<std::string, std::vector<std::byte>> params, state, opt;
  std::int64_t step = 0;
  bool operator==(const Snapshot&) const = default;
};
Snapshot snapshot(const train::Trainer& t) {
  return {bits(t.params()), bits(t.model_state()), bits(t.optimizer_state()), t.step()};
}

using pmap::testing::stacked;

// Rewrites a checkpoint through `edit` (its tensors and metadata) into `to`.
template <class Edit>
void rewrite(const std::filesystem::path& from, const std::filesystem::path& to, Edit edit) {
  pmap::io::SafetensorsFile f = pmap::io::load_safetensors(from);
  edit(f.tensors, f.metadata);
  pmap::io::save_safetensors(to, f.tensors, f.metadata);
}

pmap::io::TensorEntry* find(std::vector<pmap::io::TensorEntry>& tensors, const std::string& name) {
  for (auto& e : tensors)
    if (e.name == name) return &e;
  FAIL("no tensor " << name);
  return nullptr;
}

}  // namespace

TEST_CASE("trainer checkpoints: an ensemble resumes bit for bit, on its device count and on others") {
  // flax-cnn, 4 members, SGD with momentum, seed 5: 2 epochs straight on 2 devices, against 1 epoch saved and
  // continued on 1, 2 and 4 devices (a member trains alike whatever the devices).
  const auto path = temp_path("ensemble.safetensors");
  const train::TrainerOptions o{.members = 4, .batch_size = 64, .seed = 5};
  train::Trainer straight(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, 2), o);
  straight.run_epoch(data().train);
  const Snapshot after_one = snapshot(straight);
  straight.run_epoch(data().train);
  const Snapshot after_two = snapshot(straight);
  {
    train::Trainer first(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, 2), o);
    first.run_epoch(data().train);
    first.save(path, {{"program", R"({"epochs": 2})"}});
  }
  const pmap::io::SafetensorsFile f = pmap::io::load_safetensors(path);
  CHECK(f.metadata.at("format") == "pmapcc.train.v1");
  CHECK(f.metadata.at("step") == "10");
  CHECK(f.metadata.at("epochs_done") == "1");
  CHECK(f.metadata.at("devices") == "2");
  CHECK(f.metadata.at("program") == R"({"epochs": 2})");
  REQUIRE(f.find("params/Conv_0/kernel") != nullptr);
  CHECK(f.find("params/Conv_0/kernel")->shape == std::vector<std::int64_t>{4, 3, 3, 1, 32});
  CHECK(f.find("opt/trace/Dense_1/bias")->shape == std::vector<std::int64_t>{4, 10});
  CHECK(f.find("opt/count")->shape == std::vector<std::int64_t>{1});  // once: every device holds the same
  for (const int devices : {1, 2, 4}) {
    CAPTURE(devices);
    train::Trainer resumed(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, devices), o);
    const train::Checkpoint ck = resumed.load(path);
    CHECK(ck.metadata.at("program") == R"({"epochs": 2})");
    CHECK(ck.tensors.empty());
    CHECK(resumed.epochs_done() == 1);
    CHECK(snapshot(resumed) == after_one);
    const train::EpochReport r = resumed.run_epoch(data().train);
    CHECK(r.epoch == 2);
    CHECK(snapshot(resumed) == after_two);
  }
  // A file that cannot be written.
  CHECK_THROWS_AS(straight.save(temp_path("no_such_directory") / "x.safetensors"), pmap::IoError);
  // The Trainer's own metadata keys are its own.
  CHECK_THROWS_WITH_AS(straight.save(path, {{"seed", "1"}}),
                       "train::Trainer::save: metadata key 'seed' is one the Trainer writes itself", pmap::ValueError);
}

TEST_CASE("trainer checkpoints: data parallel Adam resumes bit for bit, its moments and count included") {
  const auto path = temp_path("data_parallel.safetensors");
  const train::TrainerOptions o{.data_parallel = true, .batch_size = 64, .seed = 2};
  auto adam = [] { return train::Optimizer(optim::Adam{.learning_rate = 1e-3f}); };
  train::Trainer straight(train::keras_convnet({12, 12, 1}), adam(), mesh(pmap::DeviceKind::cpu, 2), o);
  train::Trainer first(train::keras_convnet({12, 12, 1}), adam(), mesh(pmap::DeviceKind::cpu, 2), o);
  straight.run_epoch(data().train);
  first.run_epoch(data().train);
  first.save(path);
  straight.run_epoch(data().train);
  train::Trainer resumed(train::keras_convnet({12, 12, 1}), adam(), mesh(pmap::DeviceKind::cpu, 2), o);
  resumed.load(path);
  CHECK(resumed.optimizer_state().at("count").to_vector<std::int64_t>() == std::vector<std::int64_t>{10});
  CHECK(resumed.model_state().size() == resumed.model().state_names().size());  // BatchNorm's moving statistics
  CHECK(!resumed.model_state().empty());
  resumed.run_epoch(data().train);
  CHECK(snapshot(resumed) == snapshot(straight));
}

namespace {

// A checkpoint the runner wrote, committed (tests/data/runner/README.md: its configuration and data).
std::filesystem::path runner_file(const std::string& name) {
  return std::filesystem::path(PMAPCC_SOURCE_DIR) / "tests" / "data" / "runner" / name;
}

// Row g of tensors `prefix + name` of a safetensors file, for each of `names`, as its bytes (by name).
std::map<std::string, std::vector<std::byte>> file_row(const pmap::io::SafetensorsFile& f, const std::string& prefix,
                                                       const std::vector<std::string>& names, std::int64_t g) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const std::string& n : names) {
    const pmap::io::TensorEntry* e = f.find(prefix + n);
    REQUIRE(e != nullptr);
    const auto row = static_cast<std::ptrdiff_t>(e->data.size()) / static_cast<std::ptrdiff_t>(e->shape.at(0));
    out.emplace(n, std::vector<std::byte>(e->data.begin() + g * row, e->data.begin() + (g + 1) * row));
  }
  return out;
}

// The tensors `prefix + name` of a safetensors file whole, by `rename(name)` (the Trainer's name for it).
template <class Rename>
std::map<std::string, std::vector<std::byte>> file_bits(const pmap::io::SafetensorsFile& f, const std::string& prefix,
                                                        const std::vector<std::string>& names, Rename rename) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const std::string& n : names) {
    const pmap::io::TensorEntry* e = f.find(prefix + n);
    REQUIRE(e != nullptr);
    out.emplace(rename(n), e->data);
  }
  return out;
}

// Those of `all` whose names start with `prefix`.
std::map<std::string, std::vector<std::byte>> starting(const std::map<std::string, std::vector<std::byte>>& all,
                                                       const std::string& prefix) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, b] : all)
    if (name.starts_with(prefix)) out.emplace(name, b);
  return out;
}

}  // namespace

TEST_CASE("trainer checkpoints: the runner's files load with their members, optimizer slots and per-member rates") {
  // What a load restores, against the files' own tensors; their evaluation and continuation on the runner's data
  // (tests/cli/make_idx.py's) are tests/cli/run_runner_checkpoints.sh's. Each holds one epoch of 256 examples
  // in batches of 32: 8 steps.
  auto same_name = [](const std::string& n) { return n; };
  SUBCASE("an ensemble with SGD's momentum (opt/momentum/<tensor>) and a learning rate each") {
    // flax-cnn on 4x4 images, 2 members, --lr 0.1,0.05, seed 5.
    const auto path = runner_file("flax_cnn_ensemble.safetensors");
    const pmap::io::SafetensorsFile f = pmap::io::load_safetensors(path);
    const train::Model model = train::flax_cnn({4, 4, 1});
    const train::TrainerOptions o{.members = 2, .batch_size = 32, .seed = 5,
                                  .hyperparams = {.learning_rate = {0.1f, 0.05f}}};
    const train::Optimizer adam_tx(optim::Adam{.learning_rate = 1e-3f});
    train::Trainer adam(model, adam_tx, mesh(pmap::DeviceKind::cpu, 1), o);
    CHECK_THROWS_WITH_AS(adam.load(path),
                         (path.string() + ": the checkpoint was trained with optim::Sgd, this Trainer with "
                                          "optim::Adam").c_str(), pmap::DataError);
    train::Trainer plain(model, sgd(), mesh(pmap::DeviceKind::cpu, 1), {.members = 2, .batch_size = 32, .seed = 5});
    CHECK_THROWS_WITH_AS(plain.load(path),
                         (path.string() + ": the checkpoint's members were trained with one learning_rate each "
                                          "([0.1,0.05]); give them as options.hyperparams.learning_rate").c_str(),
                         pmap::DataError);
    train::TrainerOptions rates = o;
    rates.hyperparams.learning_rate = {0.1f, 0.03f};
    train::Trainer other(model, sgd(), mesh(pmap::DeviceKind::cpu, 1), rates);
    CHECK_THROWS_WITH_AS(other.load(path),
                         doctest::Contains("the checkpoint's members were trained with learning_rate [0.1, 0.05]; "
                                           "this Trainer's are [0.1, 0.03]"),
                         pmap::DataError);
    train::TrainerOptions seed = o;
    seed.seed = 6;
    train::Trainer another(model, sgd(), mesh(pmap::DeviceKind::cpu, 1), seed);
    CHECK_THROWS_WITH_AS(another.load(path),
                         doctest::Contains("the checkpoint was trained from seed 5; this Trainer's is 6"),
                         pmap::DataError);
    const auto names = model.param_names();
    for (const int devices : {1, 2}) {
      CAPTURE(devices);
      train::Trainer now(model, sgd(), mesh(pmap::DeviceKind::cpu, devices), o);
      const train::Checkpoint ck = now.load(path);
      CHECK(ck.metadata.at("format") == "pmapcc.ensemble.v2");
      CHECK(now.step() == 8);
      CHECK(now.epochs_done() == 1);
      CHECK(bits(now.params()) == file_bits(f, "params/", names, same_name));
      const auto opt = bits(now.optimizer_state());
      CHECK(starting(opt, "trace/") ==
            file_bits(f, "opt/momentum/", names, [](const std::string& n) { return "trace/" + n; }));
      CHECK(now.optimizer_state().at("count").to_vector<std::int64_t>() == std::vector<std::int64_t>{8});
      std::vector<float> lr;  // each device's members' rates, in mesh order
      for (std::size_t d = 0; d < now.states().size(); ++d)
        for (float r : now.states()[d].hyperparams.at("learning_rate").to_vector<float>()) lr.push_back(r);
      CHECK(lr == std::vector<float>{0.1f, 0.05f});
    }
  }
  SUBCASE("data parallel keras-convnet with Adam (opt/m, opt/v, and the count from the step)") {
    // keras-convnet on 12x12 images, one model over 2 devices, Adam 1e-3, seed 7.
    const auto path = runner_file("keras_convnet_data_parallel.safetensors");
    const pmap::io::SafetensorsFile f = pmap::io::load_safetensors(path);
    const train::Model model = train::keras_convnet({12, 12, 1});
    auto adam = [] { return train::Optimizer(optim::Adam{.learning_rate = 1e-3f}); };
    const auto names = model.param_names();
    for (const int devices : {2, 1}) {  // the devices it was written from, and another count
      CAPTURE(devices);
      train::Trainer now(model, adam(), mesh(pmap::DeviceKind::cpu, devices),
                         {.data_parallel = true, .batch_size = 32, .seed = 7});
      now.load(path);
      CHECK(now.step() == 8);
      CHECK(now.epochs_done() == 1);
      CHECK(now.optimizer_state().at("count").to_vector<std::int64_t>() == std::vector<std::int64_t>{8});
      CHECK(bits(now.params()) == file_bits(f, "params/", names, same_name));
      CHECK(bits(now.model_state()) == file_bits(f, "state/", model.state_names(), same_name));
      const auto opt = bits(now.optimizer_state());
      CHECK(starting(opt, "mu/") == file_bits(f, "opt/m/", names, [](const std::string& n) { return "mu/" + n; }));
      CHECK(starting(opt, "nu/") == file_bits(f, "opt/v/", names, [](const std::string& n) { return "nu/" + n; }));
      CHECK(now.params().at("Dense_0/kernel").dim(0) == 1);  // the one model
    }
    // Another mode is refused, naming it.
    train::Trainer ensemble(model, adam(), mesh(pmap::DeviceKind::cpu, 1), {.members = 1, .batch_size = 32, .seed = 7});
    CHECK_THROWS_WITH_AS(ensemble.load(path),
                         (path.string() + ": the checkpoint was trained in data-parallel mode; this Trainer trains "
                                          "an ensemble").c_str(),
                         pmap::DataError);
  }
}

TEST_CASE("trainer checkpoints: mismatched and corrupt files are refused before the Trainer changes") {
  const auto path = temp_path("good.safetensors"), bad = temp_path("bad.safetensors");
  const train::TrainerOptions o{.members = 2, .batch_size = 64, .seed = 1};
  train::Trainer t(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, 1), o);
  t.run_epoch(data().train);
  t.save(path);
  train::Trainer fresh(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, 2), o);
  const Snapshot before = snapshot(fresh);
  const std::string file = bad.string() + ": ";
  auto refused = [&](const std::string& message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(fresh.load(bad), (file + message).c_str(), pmap::DataError);
  };
  auto with = [&](auto edit) { rewrite(path, bad, edit); };
  using Tensors = std::vector<pmap::io::TensorEntry>;
  using Meta = std::map<std::string, std::string>;

  with([](Tensors&, Meta& m) { m.erase("format"); });
  refused("__metadata__ has no 'format': not a pmapcc checkpoint");
  with([](Tensors&, Meta& m) { m["format"] = "pmapcc.train.v9"; });
  refused("format 'pmapcc.train.v9' is not pmapcc.train.v1 (nor the runner's pmapcc.ensemble.v2 or "
          "pmapcc.ensemble.v1)");
  with([](Tensors&, Meta& m) { m["seed"] = "7"; });
  refused("the checkpoint was trained from seed 7; this Trainer's is 1 (options.seed: the members' keys and the "
          "epochs' orders come from it)");
  with([](Tensors&, Meta& m) { m["members"] = "4"; });
  refused("the checkpoint holds 4 members; this Trainer has 2 (options.members)");
  with([](Tensors&, Meta& m) { m["model"] = "keras-convnet"; });
  refused("the checkpoint holds model 'keras-convnet'; this Trainer trains 'flax-cnn'");
  with([](Tensors&, Meta& m) { m["mode"] = "data-parallel"; });
  refused("the checkpoint was trained in data-parallel mode; this Trainer trains an ensemble");
  with([](Tensors&, Meta& m) { m["optimizer"] = "optim::Adam"; });
  refused("the checkpoint was trained with optim::Adam, this Trainer with optim::Sgd");
  with([](Tensors&, Meta& m) { m["step"] = "many"; });
  CHECK_THROWS_WITH_AS(fresh.load(bad), doctest::Contains((file + "__metadata__.step").c_str()), pmap::DataError);
  with([](Tensors&, Meta& m) { m["epochs_done"] = "11"; });
  refused("step 10 and epochs_done 11 do not describe a run");
  with([](Tensors& ts, Meta&) { std::erase_if(ts, [](const auto& e) { return e.name == "params/Dense_0/bias"; }); });
  refused("tensor 'params/Dense_0/bias' is missing (this Trainer's is F32(2, 256))");
  with([](Tensors& ts, Meta&) {
    auto* e = find(ts, "opt/trace/Dense_0/bias");
    e->shape = {1, 512};
  });
  refused("tensor 'opt/trace/Dense_0/bias' is F32(1, 512); this Trainer's is F32(2, 256)");
  with([](Tensors& ts, Meta&) {
    auto* e = find(ts, "params/Conv_1/kernel");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(e->data.data() + 8, &nan, sizeof nan);
  });
  refused("tensor 'params/Conv_1/kernel' holds a NaN or an infinity");
  with([](Tensors& ts, Meta&) {
    ts.push_back(pmap::io::make_tensor<float>("hyperparams/learning_rate", {2}, std::vector<float>{0.1f, 0.1f}));
  });
  refused("holds tensors this Trainer does not (another model or optimizer, per-member hyper-parameters it was not "
          "given, or a part's, whose prefix load's `others` names): 'hyperparams/learning_rate'");
  with([](Tensors&, Meta& m) { m["seed"] = "18446744073709551615"; });  // 2^64 - 1: read as the unsigned it is
  refused("the checkpoint was trained from seed 18446744073709551615; this Trainer's is 1 (options.seed: the "
          "members' keys and the epochs' orders come from it)");
  // Not a checkpoint at all, and no file.
  pmap::io::save_safetensors(bad, {}, {});
  refused("__metadata__ has no 'format': not a pmapcc checkpoint");
  CHECK_THROWS_AS(fresh.load(temp_path("missing.safetensors")), pmap::DataError);
  // Nothing changed: the same state, and it still trains.
  CHECK(snapshot(fresh) == before);
  CHECK(fresh.epochs_done() == 0);
  fresh.run_epoch(data().train);
  CHECK(fresh.step() == 10);
}

// Row `g` of each (members, ...) host tensor, as its bytes.
std::map<std::string, std::vector<std::byte>> row(const train::Variables& v, std::int64_t g) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, a] : v) {
    const std::size_t n = static_cast<std::size_t>(a.nbytes() / a.dim(0));
    std::vector<std::byte> all(a.nbytes());
    a.copy_to_host(all.data(), all.size());
    out.emplace(name, std::vector<std::byte>(all.begin() + static_cast<std::ptrdiff_t>(n * g),
                                             all.begin() + static_cast<std::ptrdiff_t>(n * (g + 1))));
  }
  return out;
}

TEST_CASE("trainer checkpoints: read_members picks members out of a file, evaluated as they were in the run") {
  const auto path = temp_path("members.safetensors");
  train::Trainer t(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, 2),
                   {.members = 4, .batch_size = 64, .seed = 4,
                    .hyperparams = {.learning_rate = {0.1f, 0.05f, 0.2f, 0.1f}}});
  t.run_epoch(data().train);
  t.save(path);
  const train::Evaluation whole = t.evaluate(data().test);
  const train::SavedMembers saved = train::read_members(path, t.model(), {2, 0});
  CHECK(saved.members == 4);
  CHECK(saved.metadata.at("format") == "pmapcc.train.v1");
  CHECK(saved.params.at("Conv_0/kernel").shape() == pmap::Shape{2, 3, 3, 1, 32});
  CHECK(row(saved.params, 0) == row(t.params(), 2));
  CHECK(row(saved.params, 1) == row(t.params(), 0));
  CHECK(saved.state.empty());  // flax-cnn keeps no model state
  // The two members as an ensemble of their own, on one device: each member's numbers are the run's.
  train::Trainer two(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, 1), {.members = 2});
  two.set_members(saved.params, saved.state, {0, 1});
  const train::Evaluation picked = two.evaluate(data().test);
  CHECK(picked.member_accuracy == std::vector<double>{whole.member_accuracy[2], whole.member_accuracy[0]});
  CHECK(picked.member_calibration[0].nll == whole.member_calibration[2].nll);
  CHECK(train::read_members(path, t.model()).params.at("Dense_1/bias").dim(0) == 4);  // every member

  // The runner's files: keras-convnet's parameters and BatchNorm statistics (its one model), into a Trainer of
  // one member; flax-cnn's two members, picked in another order.
  const auto runner_path = runner_file("keras_convnet_data_parallel.safetensors");
  const pmap::io::SafetensorsFile rf = pmap::io::load_safetensors(runner_path);
  const train::Model keras = train::keras_convnet({12, 12, 1});
  const train::SavedMembers r = train::read_members(runner_path, keras);
  CHECK(r.members == 1);
  CHECK(r.metadata.at("format") == "pmapcc.ensemble.v2");
  CHECK(row(r.params, 0) == file_row(rf, "params/", keras.param_names(), 0));
  CHECK(row(r.state, 0) == file_row(rf, "state/", keras.state_names(), 0));
  train::Trainer from_runner(keras, sgd(), mesh(pmap::DeviceKind::cpu, 1), {.members = 1});
  from_runner.set_members(r.params, r.state, {0});
  CHECK(row(from_runner.params(), 0) == file_row(rf, "params/", keras.param_names(), 0));
  CHECK(row(from_runner.model_state(), 0) == file_row(rf, "state/", keras.state_names(), 0));
  const auto flax_path = runner_file("flax_cnn_ensemble.safetensors");
  const pmap::io::SafetensorsFile ff = pmap::io::load_safetensors(flax_path);
  const train::Model small = train::flax_cnn({4, 4, 1});
  const train::SavedMembers swapped = train::read_members(flax_path, small, {1, 0});
  CHECK(swapped.members == 2);
  CHECK(row(swapped.params, 0) == file_row(ff, "params/", small.param_names(), 1));
  CHECK(row(swapped.params, 1) == file_row(ff, "params/", small.param_names(), 0));

  // The errors: members outside the file or asked twice, another model, a file that is not a checkpoint, a
  // tensor missing, misshapen or not finite.
  CHECK_THROWS_WITH_AS(train::read_members(path, t.model(), {4}),
                       doctest::Contains("member 4 is not among the 4 members (0..3) of"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::read_members(path, t.model(), {-1}), doctest::Contains("member -1 is not among"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::read_members(path, t.model(), {1, 3, 1}), "member 1 is asked for twice",
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::read_members(path, keras),
                       doctest::Contains("the checkpoint holds model 'flax-cnn', not 'keras-convnet'"),
                       pmap::DataError);
  CHECK_THROWS_WITH_AS(train::read_members(runner_path, t.model()),
                       doctest::Contains("the checkpoint holds model 'keras-convnet', not 'flax-cnn'"),
                       pmap::DataError);
  const auto bad = temp_path("members_bad.safetensors");
  rewrite(path, bad, [](auto&, auto& metadata) { metadata.erase("format"); });
  CHECK_THROWS_WITH_AS(train::read_members(bad, t.model()), doctest::Contains("has no 'format'"), pmap::DataError);
  rewrite(path, bad, [](auto& tensors, auto&) {
    std::erase_if(tensors, [](const pmap::io::TensorEntry& e) { return e.name == "params/Dense_0/bias"; });
  });
  CHECK_THROWS_WITH_AS(train::read_members(bad, t.model()),
                       doctest::Contains("tensor 'params/Dense_0/bias' is missing (the model's is F32(4, 256))"),
                       pmap::DataError);
  rewrite(path, bad, [](auto& tensors, auto&) {
    pmap::io::TensorEntry* e = find(tensors, "params/Dense_1/bias");
    e->shape = {2, 20};
  });
  CHECK_THROWS_WITH_AS(train::read_members(bad, t.model()), doctest::Contains("'params/Dense_1/bias' is F32(2, 20)"),
                       pmap::DataError);
  rewrite(path, bad, [](auto& tensors, auto&) {
    pmap::io::TensorEntry* e = find(tensors, "params/Dense_1/bias");
    e->dtype = pmap::DType::i32;  // the same bytes, read as integers
  });
  CHECK_THROWS_WITH_AS(train::read_members(bad, t.model()), doctest::Contains("'params/Dense_1/bias' is I32(4, 10)"),
                       pmap::DataError);
  rewrite(path, bad, [](auto& tensors, auto&) {
    pmap::io::TensorEntry* e = find(tensors, "params/Conv_0/kernel");
    e->shape[0] = 0;
    e->data.clear();
  });
  CHECK_THROWS_WITH_AS(train::read_members(bad, t.model()),
                       doctest::Contains("tensor 'params/Conv_0/kernel' is missing or holds no member"),
                       pmap::DataError);
  rewrite(path, bad, [](auto& tensors, auto&) {
    pmap::io::TensorEntry* e = find(tensors, "params/Dense_1/bias");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(e->data.data() + 3 * 10 * sizeof(float), &nan, sizeof nan);  // member 3's first bias
  });
  CHECK_NOTHROW(train::read_members(bad, t.model(), {0, 1, 2}));  // the members read are checked
  CHECK_THROWS_WITH_AS(train::read_members(bad, t.model(), {3}),
                       doctest::Contains("'params/Dense_1/bias' holds a NaN or an infinity"), pmap::DataError);
}

TEST_CASE("trainer checkpoints: the program's inspect_checkpoint reads a Trainer file's and the runner's members") {
  const auto path = temp_path("for_program.safetensors");
  train::Trainer t(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, 2),
                   {.members = 4, .batch_size = 64, .seed = 6});
  t.run_epoch(data().train);
  t.save(path);
  const pe::CheckpointSummary s = pe::inspect_checkpoint(path);
  CHECK(s.format == "pmapcc.train.v1");
  CHECK(s.members == 4);
  CHECK(s.epochs_done == 1);
  CHECK(s.config.size() == 2);
  CHECK(s.config.at("members") == 4);
  CHECK(s.config.at("model") == "flax-cnn");
  // The runner's files: their members, epochs and recorded configuration (tests/data/runner/README.md).
  const pe::CheckpointSummary flax = pe::inspect_checkpoint(runner_file("flax_cnn_ensemble.safetensors"));
  CHECK(flax.format == "pmapcc.ensemble.v2");
  CHECK(flax.members == 2);
  CHECK(flax.epochs_done == 1);
  CHECK(flax.config.at("model") == "flax-cnn");
  CHECK(flax.config.at("seed") == 5);
  const pe::CheckpointSummary keras = pe::inspect_checkpoint(runner_file("keras_convnet_data_parallel.safetensors"));
  CHECK(keras.members == 1);
  CHECK(keras.config.at("mode") == "data-parallel");
  // A caller's configuration in the metadata is kept, the model and the members the file's own; a caller's
  // record of them that differs from the file's is an altered file.
  const auto with_config = temp_path("for_program_config.safetensors");
  t.save(with_config, {{"config", R"({"batch_size": 32, "members": 4})"}});
  const pe::CheckpointSummary c = pe::inspect_checkpoint(with_config);
  CHECK(c.config.size() == 3);
  CHECK(c.config.at("batch_size") == 32);
  CHECK(c.config.at("members") == 4);
  CHECK(c.config.at("model") == "flax-cnn");
  t.save(with_config, {{"config", R"({"batch_size": 32, "members": 9})"}});
  CHECK_THROWS_WITH_AS(pe::inspect_checkpoint(with_config),
                       doctest::Contains("for_program_config.safetensors: __metadata__.config records members 9, the "
                                         "file's __metadata__.members is 4: the file was altered"),
                       pmap::DataError);
  t.save(with_config, {{"config", R"({"model": "keras-convnet"})"}});
  CHECK_THROWS_WITH_AS(pe::inspect_checkpoint(with_config),
                       doctest::Contains("__metadata__.config records model \"keras-convnet\", the file's "
                                         "__metadata__.model is \"flax-cnn\""),
                       pmap::DataError);
  t.save(with_config, {{"config", "[1, 2]"}});
  CHECK_THROWS_WITH_AS(pe::inspect_checkpoint(with_config),
                       doctest::Contains("for_program_config.safetensors: __metadata__.config is not a JSON object"),
                       pmap::DataError);
  rewrite(path, with_config, [](auto&, auto& metadata) { metadata["format"] = "pmapcc.other"; });
  CHECK_THROWS_WITH_AS(pe::inspect_checkpoint(with_config),
                       doctest::Contains("format 'pmapcc.other' is not pmapcc.train.v1 (nor the runner's "
                                         "pmapcc.ensemble.v2 or pmapcc.ensemble.v1)"),
                       pmap::DataError);
}

TEST_CASE("trainer checkpoints on GPUs: written on fake GPUs, continued on CPU devices as on the GPUs") {
  PMAPCC_REQUIRE_GPU();
  const auto path = temp_path("gpu.safetensors");
  const train::TrainerOptions o{.members = 2, .batch_size = 64, .seed = 4};
  train::Trainer gpu(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cuda, 2), o);
  gpu.run_epoch(data().train);
  gpu.save(path);
  train::Trainer cpu(train::flax_cnn({12, 12, 1}), sgd(), mesh(pmap::DeviceKind::cpu, 1), o);
  cpu.load(path);
  CHECK(snapshot(cpu) == snapshot(gpu));
  gpu.run_epoch(data().train);
  cpu.run_epoch(data().train);
  // The GPU's products may sum in another order than the CPU's: the same run, to rounding.
  const auto& names = gpu.model().param_names();
  const float diff = pmap::testing::max_abs_diff(stacked(gpu.params(), names), stacked(cpu.params(), names));
  MESSAGE("max |parameter difference| between the GPU run and its CPU continuation: " << diff);
  CHECK(diff <= 1e-4f);
  CHECK(cpu.step() == gpu.step());
}

}  // namespace PMAPCC_TEST_FILE
