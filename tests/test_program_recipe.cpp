// The program's flags on the differentiable core (examples/mnist_ensemble/recipe.h): a TrainConfig's model,
// optimizer, schedule, clipping, weight decay, per-member values and options give train::Trainer the run they
// name: bit for bit the Trainer built by hand from the flags' documented meaning (optax's chain of the clip and
// the optimizer, its schedule, each member's values as options.hyperparams); with a weight decay per member,
// each member as a run that gives every member its values, within the rounding of the decay's arithmetic
// (optim/adam.h); a recipe's checkpoint resumes as the unbroken run; model parallelism (--layout) trains as the
// same flags unsplit, within the order of the sums. The settings the Trainer cannot run are refused, naming the
// flag; the run's checks (the mesh, a checkpoint's recipe, memory) name theirs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/recipe.h"
#include "examples/mnist_ensemble/run_checks.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace train = pmap::train;
namespace optim = pmap::optim;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

pmap::Mesh cpu_mesh(int devices, const char* axis) {
  return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), axis);
}

// The Trainer the program makes of `c` (members given) on c.devices CPU devices along the mode's axis.
std::unique_ptr<train::Trainer> recipe_trainer(const pe::TrainConfig& c) {
  const std::int64_t run_steps = static_cast<std::int64_t>(c.epochs) * (data().train.count / c.batch_size);
  return std::make_unique<train::Trainer>(pe::recipe_model(c, data().train),
                                          pe::recipe_optimizer(c.optimizer, c.members, run_steps),
                                          cpu_mesh(c.devices, c.mode == pe::Mode::ensemble ? "ensemble" : "data"),
                                          pe::recipe_options(c, c.members));
}

struct Run {
  std::vector<double> loss;  // each epoch's train loss
  train::Variables params, state;
  std::vector<std::string> param_names, state_names;
  int members = 1;
};

// `t` trained for `epochs` epochs on the training set.
Run trained(train::Trainer& t, int epochs) {
  Run r;
  for (int e = 0; e < epochs; ++e) r.loss.push_back(t.run_epoch(data().train).train_loss);
  r.params = t.params();
  r.state = t.model_state();
  r.param_names = t.model().param_names();
  r.state_names = t.model().state_names();
  r.members = t.options().members;
  return r;
}

// The recipe's Trainer of `c` trained for c.epochs epochs.
Run recipe_run(const pe::TrainConfig& c) { return trained(*recipe_trainer(c), c.epochs); }

std::vector<float> params_of(const Run& r) { return pmap::testing::stacked(r.params, r.param_names); }
std::vector<float> state_of(const Run& r) { return pmap::testing::stacked(r.state, r.state_names); }

// Member g's rows of `v`'s tensors (members, ...), tensor after tensor in the order of `names`.
std::vector<float> member_rows(const train::Variables& v, const std::vector<std::string>& names, int members, int g) {
  std::vector<float> out;
  for (const std::string& n : names) {
    const std::vector<float> all = v.at(n).to_vector<float>();
    const std::size_t each = all.size() / static_cast<std::size_t>(members), at = each * static_cast<std::size_t>(g);
    out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(at),
               all.begin() + static_cast<std::ptrdiff_t>(at + each));
  }
  return out;
}
std::vector<float> member_params(const Run& r, int g) { return member_rows(r.params, r.param_names, r.members, g); }
std::vector<float> member_state(const Run& r, int g) { return member_rows(r.state, r.state_names, r.members, g); }

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
  const Run r = recipe_run(c);
  // What the flags name: each member's gradients clipped to norm 1, then optax's SGD with Nesterov momentum 0.9
  // (flax-cnn's recipe) at a rate warmed up over 3 steps and decayed by a cosine to 0.1 of it over the rest of
  // the run's 2 x 10 steps, each member's base rate its own.
  const optim::Schedule cosine = optim::cosine_decay_schedule(0.1f, {.decay_steps = 2 * 10 - 3, .alpha = 0.1,
                                                                     .warmup_steps = 3});
  train::Trainer by_hand(train::flax_cnn({12, 12, 1}),
                         train::Optimizer(optim::chain(optim::clip_by_global_norm(1.0f),
                                                       optim::Sgd{.learning_rate = cosine, .momentum = 0.9f,
                                                                  .nesterov = true})),
                         cpu_mesh(2, "ensemble"),
                         {.members = 4, .batch_size = 64, .seed = 5,
                          .hyperparams = {.learning_rate = {0.1f, 0.05f, 0.2f, 0.1f}}, .eval_batch = 128});
  const Run expected = trained(by_hand, 2);
  CHECK(r.loss == expected.loss);
  CHECK(params_of(r) == params_of(expected));
  // Without clipping and with the members' rates all 0.1 as one value, under an exponential decay: SGD alone.
  c.optimizer.clip_norm = 0;
  c.optimizer.learning_rate = {0.1f};
  c.optimizer.schedule = pe::parse_schedule("exponential:0.5:4");
  train::Trainer plain(train::flax_cnn({12, 12, 1}),
                       train::Optimizer(optim::Sgd{
                           .learning_rate = optim::exponential_decay_schedule(0.1f, {.transition_steps = 4,
                                                                                     .decay_rate = 0.5}),
                           .momentum = 0.9f, .nesterov = true}),
                       cpu_mesh(2, "ensemble"), {.members = 4, .batch_size = 64, .seed = 5, .eval_batch = 128});
  CHECK(params_of(recipe_run(c)) == params_of(trained(plain, 2)));
}

TEST_CASE("program recipe: Adam data parallel with BatchNorm and dropout, and a zero decay, bit for bit") {
  pe::TrainConfig c = pmap::testing::small_config(2, 1, 1);
  c.model = "keras-convnet";
  c.optimizer.name = "adam";
  c.mode = pe::Mode::data_parallel;
  c.dropout = {0.25f};
  c.optimizer.weight_decay = {0.0f};
  const Run r = recipe_run(c);
  // Keras's Adam (rate 1e-3, betas 0.9 and 0.999, epsilon 1e-7) without decay, one model over the "data" axis,
  // its Dropout at --dropout's rate.
  train::Trainer by_hand(train::keras_convnet({12, 12, 1}),
                         train::Optimizer(optim::Adam{.learning_rate = 1e-3f, .beta_1 = 0.9, .beta_2 = 0.999,
                                                      .epsilon = 1e-7f}),
                         cpu_mesh(2, "data"),
                         {.members = 1, .data_parallel = true, .batch_size = 64,
                          .hyperparams = {.dropout_rate = {0.25f}}, .eval_batch = 128});
  const Run expected = trained(by_hand, 1);
  CHECK(params_of(r) == params_of(expected));
  CHECK(state_of(r) == state_of(expected));
  CHECK(r.loss == expected.loss);
  // The rate is --dropout's: with the model's own (0.5) the run ends elsewhere.
  c.dropout = {};
  CHECK(params_of(recipe_run(c)) != params_of(r));
}

TEST_CASE("program recipe: weight decay and dropout per member: each member as its values for all, within rounding") {
  // A member of decay 0 beside a decaying one takes the decay's arithmetic, rounded once more than without it
  // (optim/adam.h): a few elements an ulp apart after a step, which training carries on without growing far.
  for (const char* name : {"sgd", "adam", "adamw"}) {
    CAPTURE(name);
    pe::TrainConfig c = pmap::testing::small_config(2, 2, 2);
    c.model = "keras-convnet";
    c.optimizer.name = name;
    c.optimizer.learning_rate = {std::string(name) == "sgd" ? 0.05f : 2e-3f};
    c.optimizer.weight_decay = {0.0f, 0.02f};
    c.dropout = {0.1f, 0.3f};
    const Run mixed = recipe_run(c);
    pe::TrainConfig first = c, second = c, none = c;
    first.optimizer.weight_decay = {0.0f};
    first.dropout = {0.1f};
    second.optimizer.weight_decay = {0.02f};
    second.dropout = {0.3f};
    none.optimizer.weight_decay = {0.0f, 0.0f};  // no member decays
    const Run a = recipe_run(first), b = recipe_run(second), plain = recipe_run(none);
    // `second` is what the flags mean, built by hand: the optimizer with its decay, the dropout rate per member.
    const std::string n = name;
    const float lr = c.optimizer.learning_rate[0];
    const train::Optimizer tx =
        n == "sgd"  ? train::Optimizer(optim::Sgd{.learning_rate = lr, .momentum = 0.9f, .weight_decay = 0.02f})
        : n == "adam" ? train::Optimizer(optim::Adam{.learning_rate = lr, .beta_1 = 0.9, .beta_2 = 0.999,
                                                     .epsilon = 1e-7f, .weight_decay = 0.02f})
                      : train::Optimizer(optim::AdamW{.learning_rate = lr, .beta_1 = 0.9, .beta_2 = 0.999,
                                                      .epsilon = 1e-7f, .weight_decay = 0.02f});
    train::Trainer by_hand(train::keras_convnet({12, 12, 1}), tx, cpu_mesh(2, "ensemble"),
                           {.members = 2, .batch_size = 64, .hyperparams = {.dropout_rate = {0.3f, 0.3f}},
                            .eval_batch = 128});
    CHECK(params_of(trained(by_hand, 2)) == params_of(b));
    CHECK(max_relative(member_params(a, 0), member_params(mixed, 0)) < 1e-4);
    CHECK(max_relative(member_state(a, 0), member_state(mixed, 0)) < 1e-4);
    CHECK(max_relative(member_params(b, 1), member_params(mixed, 1)) < 1e-4);
    CHECK(max_relative(member_state(b, 1), member_state(mixed, 1)) < 1e-4);
    // With no member decaying, no decay's arithmetic: member 0 is the bits of its values for all.
    CHECK(member_params(plain, 0) == member_params(a, 0));
    // The decay is applied: without it member 1 ends elsewhere.
    CHECK(max_relative(member_params(plain, 1), member_params(mixed, 1)) > 1e-3);
  }
}

TEST_CASE("program recipe: AdamW's default decay clipped, and a recipe's checkpoint resumed as the straight run") {
  pe::TrainConfig c = pmap::testing::small_config(2, 2, 1);
  c.model = "keras-convnet";
  c.optimizer.name = "adamw";  // no --weight-decay: Keras's 0.004 for every member
  c.optimizer.clip_norm = 0.5f;
  const Run r = recipe_run(c);
  train::Trainer by_hand(train::keras_convnet({12, 12, 1}),
                         train::Optimizer(optim::chain(optim::clip_by_global_norm(0.5f),
                                                       optim::AdamW{.learning_rate = 1e-3f, .beta_1 = 0.9,
                                                                    .beta_2 = 0.999, .epsilon = 1e-7f,
                                                                    .weight_decay = 0.004f})),
                         cpu_mesh(2, "ensemble"), {.members = 2, .batch_size = 64, .eval_batch = 128});
  CHECK(params_of(trained(by_hand, 1)) == params_of(r));
  c.optimizer.weight_decay = {0.004f};  // Keras's default, given: the same run
  CHECK(params_of(recipe_run(c)) == params_of(r));
  c.optimizer.weight_decay = {0.0f};
  CHECK(params_of(recipe_run(c)) != params_of(r));

  // One dropout rate for all (each member's hyper-parameter) and a decay list of zeros (one value for all): the
  // recipe's Trainer saved after an epoch and resumed by another ends as the unbroken run.
  pe::TrainConfig k = pmap::testing::small_config(2, 2, 2);
  k.model = "keras-convnet";
  k.optimizer.name = "adam";
  k.dropout = {0.25f};
  k.optimizer.weight_decay = {0.0f, 0.0f};
  const auto straight = recipe_trainer(k);
  straight->run_epoch(data().train);
  straight->run_epoch(data().train);
  const auto half = recipe_trainer(k);
  half->run_epoch(data().train);
  const auto path = pmap::testing::scratch_dir("pmapcc_recipe_test") / "half.safetensors";
  half->save(path);
  const auto resumed = recipe_trainer(k);
  resumed->load(path);
  CHECK(resumed->epochs_done() == 1);
  resumed->run_epoch(data().train);
  CHECK(pmap::testing::stacked(resumed->params(), resumed->model().param_names()) ==
        pmap::testing::stacked(straight->params(), straight->model().param_names()));
  CHECK(pmap::testing::stacked(resumed->model_state(), resumed->model().state_names()) ==
        pmap::testing::stacked(straight->model_state(), straight->model().state_names()));
}

TEST_CASE("program recipe: model parallel trains on the Trainer as the same flags unsplit") {
  // --mode model-parallel --mesh DxM and an ensemble on --mesh 1x2: the Trainer's sharding from --layout (the
  // Megatron default, and the convolutions split too) against the same model on the mode's axis alone, from the
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
    // Flax's CNN on 12x12 images: the weights each layout splits over 'model'.
    const std::int64_t conv0 = 9 * 32 + 32, conv1 = 9 * 32 * 64 + 64, dense0 = 576 * 256 + 256, dense1 = 256 * 10 + 10;
    std::int64_t split_weights = dense0 + 256 * 10;  // Megatron: Dense_0 column-, Dense_1's kernel row-parallel
    if (k.convs) {
      pe::LayoutMap layout;
      layout.add("Conv_0/kernel", pe::PartitionSpec::parse("None,None,None,model"), true);
      layout.add("Conv_0/bias", pe::PartitionSpec::parse("model"), true);
      layout.add("Conv_1/kernel", pe::PartitionSpec::parse("None,None,model,None"), true);
      for (const auto& e : c.layout.entries()) layout.add(e.pattern, e.spec, e.must_match);
      c.layout = layout;
      split_weights += conv0 + 9 * 32 * 64;
    }
    const train::Model model = pe::recipe_model(c, data().train);
    pmap::Mesh grid = pe::build_mesh(c);
    REQUIRE(grid.axes().size() == 2);
    const pe::RecipeSharding split = pe::recipe_sharding(c, model, grid.axes());
    const std::int64_t full = conv0 + conv1 + dense0 + dense1;
    CHECK(split.full_params == full);
    CHECK(split.local_params == full - split_weights + split_weights / k.model);
    train::TrainerOptions options = pe::recipe_options(c, k.members);
    CHECK(options.data_parallel == (k.mode == pe::Mode::model_parallel));
    const std::int64_t run_steps = data().train.count / c.batch_size;
    train::Trainer whole(model, pe::recipe_optimizer(c.optimizer, k.members, run_steps),
                         cpu_mesh(k.along, k.mode == pe::Mode::ensemble ? "ensemble" : "data"), options);
    options.sharding = split.sharding;
    train::Trainer now(model, pe::recipe_optimizer(c.optimizer, k.members, run_steps), std::move(grid), options);
    const double whole_loss = whole.run_epoch(data().train).train_loss;
    const double new_loss = now.run_epoch(data().train).train_loss;
    CHECK(new_loss == doctest::Approx(whole_loss).epsilon(1e-6));
    const float diff = pmap::testing::max_abs_diff(pmap::testing::stacked(now.params(), model.param_names()),
                                                   pmap::testing::stacked(whole.params(), model.param_names()));
    MESSAGE("model parallel " << k.along << "x" << k.model << ": the parameters against the unsplit run's, "
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
  const pmap::Mesh grid = pe::build_mesh(c);  // as configured: (ensemble, model) even with M = 1
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
