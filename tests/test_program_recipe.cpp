// The program's flags on the differentiable core (examples/mnist_ensemble/recipe.h): a TrainConfig's model,
// optimizer, schedule, clipping, weight decay, per-member values and options give train::Trainer the
// runner's (ensemble::Trainer's) run: bit for bit where the arithmetic is the same, within rounding where the
// decoupled decay is rounded apart (optim/adam.h); and the settings the Trainer cannot run are refused,
// naming the flag.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/ensemble/run_checks.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/recipe.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace train = pmap::train;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

struct Compared {
  std::vector<double> old_loss, new_loss;  // each epoch's train loss
  std::vector<float> old_params, new_params;
  std::vector<float> old_state, new_state;
};

// `c` trained for its epochs by the runner and by train::Trainer from the recipe, on c.devices CPU devices.
Compared compare(const pe::TrainConfig& c) {
  Compared out;
  pe::Trainer old(c, data().train, data().test);
  const int members = old.total_members();
  const std::int64_t run_steps = static_cast<std::int64_t>(c.epochs) * old.steps_per_epoch();
  train::Trainer now(pe::recipe_model(c, data().train), pe::recipe_optimizer(c.optimizer, members, run_steps),
                     pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, c.devices),
                                c.mode == pe::Mode::ensemble ? "ensemble" : "data"),
                     pe::recipe_options(c, members));
  for (int e = 0; e < c.epochs; ++e) {
    out.old_loss.push_back(old.run_epoch().train_loss);
    out.new_loss.push_back(now.run_epoch(data().train).train_loss);
  }
  out.old_params = old.params();
  out.new_params = pmap::testing::stacked(now.params(), now.model().param_names());
  out.old_state = old.model_state();
  out.new_state = pmap::testing::stacked(now.model_state(), now.model().state_names());
  return out;
}

// The largest |a - b| / max(1, |a|) over the elements.
double max_relative(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::abs(static_cast<double>(a[i]))));
  return m;
}

}  // namespace

TEST_CASE("program recipe: SGD with Nesterov, per-member rates, a cosine after warmup and clipping, bit for bit") {
  pe::TrainConfig c = pmap::testing::small_config(2, 4, 2);
  c.seed = 5;
  c.optimizer.nesterov = true;
  c.optimizer.learning_rate = {0.1f, 0.05f, 0.2f, 0.1f};
  c.optimizer.schedule = pe::parse_schedule("cosine:0.1");
  c.optimizer.schedule.warmup_steps = 3;
  c.optimizer.clip_norm = 1.0f;
  const Compared r = compare(c);
  CHECK(r.new_loss == r.old_loss);
  CHECK(r.new_params == r.old_params);
  // Without clipping and with the members' rates all 0.1 as one value: the same bits again.
  c.optimizer.clip_norm = 0;
  c.optimizer.learning_rate = {0.1f};
  c.optimizer.schedule = pe::parse_schedule("exponential:0.5:4");
  const Compared plain = compare(c);
  CHECK(plain.new_params == plain.old_params);
}

TEST_CASE("program recipe: Adam data parallel with BatchNorm and dropout, and a zero decay, bit for bit") {
  pe::TrainConfig c = pmap::testing::small_config(2, 1, 1);
  c.model = "keras-convnet";
  c.optimizer.name = "adam";
  c.mode = pe::Mode::data_parallel;
  c.dropout = {0.25f};
  c.optimizer.weight_decay = {0.0f};
  const Compared r = compare(c);
  CHECK(r.new_params == r.old_params);
  CHECK(r.new_state == r.old_state);
  CHECK(r.new_loss[0] == doctest::Approx(r.old_loss[0]).epsilon(1e-6));  // the devices' losses pmean'd
}

TEST_CASE("program recipe: weight decay (one value and per member) and per-member dropout, within rounding") {
  // The decayed parameter is rounded once more than in the runner's fused kernel (optim/adam.h): a few
  // elements an ulp apart after a step, which training carries on without growing far.
  for (const char* name : {"sgd", "adam", "adamw"}) {
    CAPTURE(name);
    pe::TrainConfig c = pmap::testing::small_config(2, 2, 2);
    c.model = "keras-convnet";
    c.optimizer.name = name;
    c.optimizer.learning_rate = {std::string(name) == "sgd" ? 0.05f : 2e-3f};
    c.optimizer.weight_decay = {0.0f, 0.02f};
    c.dropout = {0.1f, 0.3f};
    const Compared r = compare(c);
    CHECK(max_relative(r.old_params, r.new_params) < 1e-4);
    CHECK(max_relative(r.old_state, r.new_state) < 1e-4);
    for (std::size_t e = 0; e < r.old_loss.size(); ++e)
      CHECK(r.new_loss[e] == doctest::Approx(r.old_loss[e]).epsilon(1e-5));
    // The decay is applied: without it the members end elsewhere.
    c.optimizer.weight_decay = {0.0f};
    if (std::string(name) == "adamw") c.optimizer.weight_decay = {0.0f, 0.0f};
    const Compared none = compare(c);
    CHECK(none.new_params == none.old_params);  // no member decays: the kernel's bits
    CHECK(max_relative(none.new_params, r.new_params) > 1e-3);
  }
}

TEST_CASE("program recipe: AdamW's default decay with clipping, and a runner's checkpoint resumed by the Trainer") {
  pe::TrainConfig c = pmap::testing::small_config(2, 2, 1);
  c.model = "keras-convnet";
  c.optimizer.name = "adamw";  // no --weight-decay: Keras's 0.004 for every member
  c.optimizer.clip_norm = 0.5f;
  const Compared r = compare(c);
  CHECK(max_relative(r.old_params, r.new_params) < 1e-4);
  c.optimizer.weight_decay = {0.004f};  // Keras's default, given: the same run
  CHECK(compare(c).new_params == r.new_params);
  c.optimizer.weight_decay = {0.0f};
  CHECK(compare(c).new_params != r.new_params);

  // The runner trains an epoch with one dropout rate for all (recorded as one number) and a decay list of
  // zeros (one value for all); the Trainer made by the recipe resumes its file and ends as the runner does.
  pe::TrainConfig k = pmap::testing::small_config(2, 2, 2);
  k.model = "keras-convnet";
  k.optimizer.name = "adam";
  k.dropout = {0.25f};
  k.optimizer.weight_decay = {0.0f, 0.0f};
  pe::Trainer straight(k, data().train, data().test);
  straight.run_epoch();
  straight.run_epoch();
  pe::Trainer half(k, data().train, data().test);
  half.run_epoch();
  const auto path = pmap::testing::scratch_dir("pmapcc_recipe_test") / "half.safetensors";
  half.save_checkpoint(path);
  const std::int64_t run_steps = static_cast<std::int64_t>(k.epochs) * half.steps_per_epoch();
  train::Trainer resumed(pe::recipe_model(k, data().train), pe::recipe_optimizer(k.optimizer, 2, run_steps),
                         pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, 2), "ensemble"),
                         pe::recipe_options(k, 2));
  resumed.load(path);
  CHECK(resumed.epochs_done() == 1);
  resumed.run_epoch(data().train);
  CHECK(pmap::testing::stacked(resumed.params(), resumed.model().param_names()) == straight.params());
  CHECK(pmap::testing::stacked(resumed.model_state(), resumed.model().state_names()) == straight.model_state());
}

TEST_CASE("program recipe: model parallel trains on the Trainer as the runner trains it") {
  // --mode model-parallel --mesh DxM and an ensemble on --mesh 1x2: the Trainer's sharding from --layout (the
  // Megatron default, and the convolutions split too) against the runner's split layers. The same model from the
  // same weights on the same batches; the split sums in another order (2026-12-07: 6e-8 at most).
  struct Case {
    pe::Mode mode;
    int along, model, members;
    bool convs;
  };
  for (const Case& k : {Case{pe::Mode::model_parallel, 1, 2, 1, false}, Case{pe::Mode::model_parallel, 2, 2, 1, true},
                        Case{pe::Mode::ensemble, 1, 2, 2, false}}) {
    CAPTURE(k.along);
    CAPTURE(k.model);
    pe::TrainConfig c = pmap::testing::small_config(k.along * k.model, k.members, 1);
    c.mode = k.mode;
    c.mesh_axis = k.along;
    c.mesh_model = k.model;
    if (k.convs) {
      pe::LayoutMap layout;
      layout.add("Conv_0/kernel", pe::PartitionSpec::parse("None,None,None,model"), true);
      layout.add("Conv_0/bias", pe::PartitionSpec::parse("model"), true);
      layout.add("Conv_1/kernel", pe::PartitionSpec::parse("None,None,model,None"), true);
      for (const auto& e : c.layout.entries()) layout.add(e.pattern, e.spec, e.must_match);
      c.layout = layout;
    }
    pe::Trainer old(c, data().train, data().test);
    const std::int64_t run_steps = old.steps_per_epoch();
    const train::Model model = pe::recipe_model(c, data().train);
    const pmap::Mesh& mesh = old.mesh();
    const pe::RecipeSharding split = pe::recipe_sharding(old.config(), model, mesh.axes());
    CHECK(split.local_params == old.plan()->local_params());
    CHECK(split.full_params == old.plan()->full_params());
    train::TrainerOptions options = pe::recipe_options(old.config(), k.members);
    CHECK(options.data_parallel == (k.mode == pe::Mode::model_parallel));
    options.sharding = split.sharding;
    train::Trainer now(model, pe::recipe_optimizer(c.optimizer, k.members, run_steps),
                       pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, k.along * k.model), mesh.axes()), options);
    const double old_loss = old.run_epoch().train_loss, new_loss = now.run_epoch(data().train).train_loss;
    CHECK(new_loss == doctest::Approx(old_loss).epsilon(1e-6));
    const float diff = pmap::testing::max_abs_diff(pmap::testing::stacked(now.params(), model.param_names()),
                                                   old.params());
    MESSAGE("model parallel " << k.along << "x" << k.model << ": the Trainer's parameters against the runner's, "
                              << "max |difference| " << diff);
    CHECK(diff <= 1e-6f);
  }
}

TEST_CASE("program recipe: --layout resolved against the model's parameters, and what it cannot give refused") {
  pe::TrainConfig c = pmap::testing::small_config(4, 1, 1);
  c.mode = pe::Mode::model_parallel;
  const train::Model cnn = pe::recipe_model(c, data().train);
  const std::vector<pmap::AxisSpec> axes{{"data", 2}, {"model", 2}};
  const pe::RecipeSharding s = pe::recipe_sharding(c, cnn, axes);
  CHECK(s.split == "Dense_0/kernel (None, 'model'), Dense_0/bias ('model',), Dense_1/kernel ('model', None)");
  CHECK(s.sharding.params.by_path().size() == 3);
  CHECK(s.sharding.params.by_path().at("Dense_1/kernel") == pmap::P("model", pmap::none));
  const std::int64_t full = (9 * 32 + 32) + (9 * 32 * 64 + 64) + (576 * 256 + 256) + (256 * 10 + 10);  // 12x12 images
  CHECK(s.full_params == full);
  CHECK(s.local_params == full - (576 * 256 + 256 + 256 * 10) / 2);
  pe::TrainConfig unsplit = c;
  unsplit.mode = pe::Mode::ensemble;
  CHECK(pe::recipe_sharding(unsplit, cnn, {{"ensemble", 4}}).sharding.empty());
  auto refused = [&](const char* pattern, const char* spec, const std::string& text,
                     std::vector<pmap::AxisSpec> on = {{"data", 2}, {"model", 2}}) {
    CAPTURE(text);
    pe::TrainConfig r = c;
    pe::LayoutMap layout;
    layout.add(pattern, pe::PartitionSpec::parse(spec), true);
    for (const auto& e : c.layout.entries()) layout.add(e.pattern, e.spec, e.must_match);
    r.layout = layout;
    CHECK_THROWS_WITH_AS(pe::recipe_sharding(r, cnn, on), doctest::Contains(text.c_str()), pmap::ValueError);
  };
  refused("Dense_9/kernel", "None,model", "layout rule 'Dense_9/kernel=(None, 'model')' gives no weight of model "
                                          "'flax-cnn' its layout");
  refused("Dense_0/kernel", "data,None", "layout of Dense_0/kernel (shape (576, 256)): ('data', None) (from pattern "
                                         "'Dense_0/kernel'): splits it over 'data', which holds other examples");
  refused("Dense_0/kernel", "None,expert", "'expert' is not an axis of the mesh ('data', 'model')");
  refused("Dense_0/kernel", "None,None,model", "has 3 entries for a 2-dimensional weight");
  refused("Dense_0/kernel", "model,model", "axis 'model' splits two dimensions");
  refused("Dense_1/kernel", "None,model", "dimension 1 (10) is not divisible by the size of 'model' (4)",
          {{"data", 1}, {"model", 4}});
  c.mode = pe::Mode::ensemble;
  c.model = "lenet";
  CHECK_THROWS_WITH_AS(pe::recipe_model(c, data().train), "--model must be one of flax-cnn, keras-convnet, got 'lenet'",
                       pmap::ValueError);
  pe::OptimizerConfig o;
  o.schedule = pe::parse_schedule("cosine");
  o.schedule.warmup_steps = 20;
  CHECK_THROWS_WITH_AS(pe::recipe_optimizer(o, 2, 20),
                       "--lr-schedule cosine: --warmup-steps 20 leaves none of the run's 20 steps for the decay",
                       pmap::ValueError);
  CHECK_NOTHROW(pe::recipe_optimizer(o, 2, 21));
  CHECK_NOTHROW(pe::recipe_optimizer(o, 2, 0));  // a run of no step (an evaluation): any warmup
  o.learning_rate = {0.1f, 0.2f, 0.3f};
  CHECK_THROWS_WITH_AS(pe::recipe_optimizer(o, 2, 21), doctest::Contains("--lr gives 3 values for 2 member(s)"),
                       pmap::ValueError);
  c = pmap::testing::small_config(2, 2, 1);
  c.optimizer.learning_rate = {0.1f, 0.2f, 0.3f};
  CHECK_THROWS_WITH_AS(pe::recipe_hyperparams(c, 2), doctest::Contains("--lr gives 3 values for 2 member(s)"),
                       pmap::ValueError);
  c.optimizer.learning_rate = {};
  c.dropout = {0.1f, 0.2f, 0.3f};
  CHECK_THROWS_WITH_AS(pe::recipe_options(c, 2), "--dropout gives 3 values for 2 member(s): give one value, or one "
                       "per member", pmap::ValueError);
  c.dropout = {1.0f};
  CHECK_THROWS_WITH_AS(pe::recipe_hyperparams(c, 2), "--dropout must be in [0, 1), got 1",
                       pmap::ValueError);
  o.learning_rate = {};
  o.name = "rmsprop";
  CHECK_THROWS_WITH_AS(pe::recipe_optimizer(o, 2, 21), doctest::Contains("--optimizer must be one of"),
                       pmap::ValueError);
}

TEST_CASE("program recipe: the run's checks: a one-axis mesh for --mesh Ax1, a checkpoint's recipe, memory") {
  pe::TrainConfig c = pmap::testing::small_config(2, 2, 1);
  c.mesh_axis = 2;
  c.mesh_model = 1;
  const pmap::Mesh grid = pe::build_mesh(c);  // the runner's: (ensemble, model) even with M = 1
  REQUIRE(grid.axes().size() == 2);
  CHECK(grid.axes()[1].name == "model");
  CHECK(grid.axes()[1].size == 1);
  const pmap::Mesh line = pe::build_mesh(c, pe::MeshAxes::one_axis);
  REQUIRE(line.axes().size() == 1);
  CHECK(line.axes()[0].name == "ensemble");
  CHECK(line.axes()[0].size == 2);
  c.mode = pe::Mode::data_parallel;
  CHECK(pe::build_mesh(c, pe::MeshAxes::one_axis).axes()[0].name == "data");
  c.mesh_axis = 1;
  c.mesh_model = 2;
  c.mode = pe::Mode::ensemble;
  CHECK_THROWS_WITH_AS(pe::build_mesh(c, pe::MeshAxes::one_axis),
                       "--mesh 1x2 splits weights over 'model', which a one-axis mesh does not", pmap::ValueError);
  CHECK(pe::build_mesh(c).axes()[1].size == 2);
  c.mesh_axis = c.mesh_model = 0;
  c.mode = pe::Mode::model_parallel;
  CHECK_THROWS_WITH_AS(pe::build_mesh(c, pe::MeshAxes::one_axis), doctest::Contains("--mode model-parallel"),
                       pmap::ValueError);
  c.mode = pe::Mode::ensemble;
  c.mesh_axis = 3;
  c.mesh_model = 1;
  CHECK_THROWS_WITH_AS(pe::build_mesh(c, pe::MeshAxes::one_axis), doctest::Contains("--mesh 3x1 needs 3 devices"),
                       pmap::ValueError);

  // A checkpoint's recorded recipe against this run's: each field named with both values.
  c = pmap::testing::small_config(2, 2, 1);
  c.architecture = {"(8, 8, 1)", "Dense(10)"};
  const pmap::io::Json saved = c.to_json();
  CHECK_NOTHROW(pe::check_resumable("ckpt.safetensors", saved, c.to_json()));
  pe::TrainConfig other = c;
  other.optimizer.learning_rate = {0.05f};
  CHECK_THROWS_WITH_AS(pe::check_resumable("ckpt.safetensors", saved, other.to_json()),
                       doctest::Contains("ckpt.safetensors: the checkpoint was written with lr = 0.1, this run "
                                         "has 0.05"),
                       pmap::DataError);
  other = c;
  other.members = 4;
  CHECK_THROWS_WITH_AS(pe::check_resumable("ckpt.safetensors", saved, other.to_json()),
                       doctest::Contains("members = 2, this run has 4"), pmap::DataError);
  other = c;
  other.architecture = {"(8, 8, 1)", "Dense(12)"};
  CHECK_THROWS_WITH_AS(pe::check_resumable("ckpt.safetensors", saved, other.to_json()),
                       "ckpt.safetensors: the checkpoint's model has layer 0 Dense(10) where this run's has Dense(12) "
                       "(resume with the same model)", pmap::DataError);
  // A file from before a field was recorded ran with its old value: SGD, no weight decay.
  pmap::io::Json old = saved;
  old.erase("weight_decay");
  CHECK_NOTHROW(pe::check_resumable("ckpt.safetensors", old, c.to_json()));
  other = c;
  other.optimizer.weight_decay = {0.01f};
  CHECK_THROWS_WITH_AS(pe::check_resumable("ckpt.safetensors", old, other.to_json()),
                       doctest::Contains("written with weight_decay = 0.0, this run has 0.01"), pmap::DataError);

  // Memory: a million members of the Flax CNN do not fit this machine, and the error names --members.
  c = pmap::testing::small_config(1, 1'000'000, 1);
  CHECK_THROWS_WITH_AS(pe::check_memory(c, 1, 824'458, 3), doctest::Contains("1000000 members (--members;"),
                       pmap::ValueError);
  CHECK_NOTHROW(pe::check_memory(pmap::testing::small_config(1, 2, 1), 1, 824'458, 3));
}

}  // namespace PMAPCC_TEST_FILE
