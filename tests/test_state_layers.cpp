// The layers with model state or randomness (BatchNormalization, Dropout) and Rescaling, as layers and in
// training: gradients against central differences; the model state as its own role (initialized, moved in
// training, read in inference, in checkpoints, resumed bit for bit, evaluated from a checkpoint); data
// parallelism and model parallelism of such a model against one device (global batch statistics, the same
// dropout masks); members independent of how they are placed; and the errors of bad models and layouts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include <pmapcc/ensemble/member_layout.h>
#include <pmapcc/ensemble/runner.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/io/safetensors.h>
#include <pmapcc/kernels/cpu_backend.h>
#include "kernel_checks.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace kc = kernel_checks;

namespace {

using pmap::testing::max_abs_diff;
using pmap::testing::small_config;

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

// On 12x12 images: Rescaling first (the shared batch), BatchNorm with and without its scale, Dropout
// between the dense layers, as the Keras guides' convnet is built.
std::unique_ptr<pe::Sequential> bn_model() {
  using pmap::kernels::Padding;
  std::vector<std::unique_ptr<pe::Layer>> l;
  l.push_back(pe::rescaling(2.0f, -0.5f));
  l.push_back(pe::conv2d("Conv_0", 6, {.kernel = 3, .stride = 2, .padding = Padding::valid, .use_bias = false}));
  l.push_back(pe::batch_norm("BatchNorm_0"));
  l.push_back(pe::relu());
  l.push_back(pe::conv2d("Conv_1", 8, {.kernel = 3, .kernel_init = pe::Init::glorot_uniform}));
  l.push_back(pe::batch_norm("BatchNorm_1", {.scale = false}));
  l.push_back(pe::relu());
  l.push_back(pe::global_avg_pool());
  l.push_back(pe::dense("Dense_0", 16, pe::Init::glorot_uniform));
  l.push_back(pe::relu());
  l.push_back(pe::dropout("dropout", 0.3f));
  l.push_back(pe::dense("Dense_1", 10));
  return std::make_unique<pe::Sequential>(pe::Dims{12, 12, 1}, std::move(l), "bn-model");
}

pe::TrainConfig adam(pe::TrainConfig c) {
  c.optimizer.name = "adam";
  return c;
}

}  // namespace

TEST_CASE("BatchNormalization, Dropout and Rescaling in training: gradients match central differences") {
  const auto& be = pmap::kernels::cpu_backend();
  const std::vector<std::uint32_t> keys{3, 4, 5, 6};
  const std::int64_t step = 7;
  pe::LayerContext context;
  context.training = true, context.keys = keys.data(), context.step = &step;
  struct Case {
    const char* what;
    std::unique_ptr<pe::Layer> layer;
    pe::Dims input;
  };
  std::vector<Case> cases;
  cases.push_back({"BatchNormalization (scale, center) on images", pe::batch_norm("bn"), {3, 2, 4}});
  cases.push_back({"BatchNormalization, center only, on features", pe::batch_norm("bn", {.scale = false}), {5}});
  cases.push_back({"Dropout(0.4)", pe::dropout("d", 0.4f), {6}});
  cases.push_back({"Rescaling(0.5, 1)", pe::rescaling(0.5f, 1.0f), {2, 3, 1}});
  for (Case& c : cases) {
    CAPTURE(c.what);
    const int members = 2, batch = 5;
    const auto n = static_cast<std::size_t>(members * batch * pe::product(c.input));
    std::vector<float> x = kc::random_floats(n, 21, 2.0f), r = kc::random_floats(n, 22), y(n), dx(n);
    std::vector<std::vector<float>> p, dp, st;
    std::uint32_t seed = 23;
    for (const pe::ParamSpec& s : c.layer->params(c.input)) {
      p.push_back(kc::random_floats(static_cast<std::size_t>(members * pe::product(s.shape)), seed++));
      dp.emplace_back(p.back().size());
    }
    for (const pe::ParamSpec& s : c.layer->state(c.input))
      st.emplace_back(static_cast<std::size_t>(members * pe::product(s.shape)), 1.0f);
    std::vector<const float*> pp;
    std::vector<float*> dpp, stp;
    for (std::size_t k = 0; k < p.size(); ++k) pp.push_back(p[k].data()), dpp.push_back(dp[k].data());
    for (auto& s : st) stp.push_back(s.data());
    pe::LayerCall call{members, batch, c.input};
    std::vector<pmap::Array> buffers;
    for (const pe::BufferSpec& b : c.layer->buffers(call)) buffers.emplace_back(pmap::Shape{b.count}, b.dtype);
    call.state = stp.data(), call.buffers = buffers.data(), call.context = &context;
    auto objective = [&] {
      c.layer->forward(be, call, pp.data(), x.data(), y.data(), nullptr);
      return kc::weighted_sum(y, r);
    };
    objective();
    c.layer->backward(be, call, pp.data(), x.data(), y.data(), r.data(), dx.data(), dpp.data(), nullptr);
    kc::check_grad("dx", dx, kc::numeric_grad(x, objective, 1e-2f), 2e-3);
    for (std::size_t k = 0; k < p.size(); ++k)
      kc::check_grad("dparams", dp[k], kc::numeric_grad(p[k], objective, 1e-2f), 2e-3);
  }
}

TEST_CASE("the model state: a role of its own, initialized, moved by training, summarized, in checkpoints") {
  const auto model = bn_model();
  CHECK(model->state_per_member() == 2 * 6 + 2 * 8);
  REQUIRE(model->state_layout().tensors.size() == 4);
  CHECK(model->state_layout().tensors[0].name == "BatchNorm_0/moving_mean");
  CHECK(model->state_layout().tensors[3].name == "BatchNorm_1/moving_variance");
  // Params: the moving statistics are not among them; BatchNorm_1 has beta only.
  for (const auto& t : model->tensors()) CHECK(t.name.find("moving") == std::string::npos);
  CHECK(model->tensors()[1].name == "BatchNorm_0/gamma");
  CHECK(model->tensors()[5].name == "BatchNorm_1/beta");  // after Conv_1's kernel and bias
  const std::string s = model->summary();
  CHECK(s.find(" Non-trainable params: 28 (112.00 B)\n") != std::string::npos);
  CHECK(s.find(" Trainable params: " + std::to_string(model->params_per_member())) != std::string::npos);
  // Keras's counts for the guides' convnet.
  const auto keras = pe::keras_convnet();
  CHECK(keras->params_per_member() == 49242);
  CHECK(keras->params_per_member() + keras->state_per_member() == 49378);
  // Initialized (means 0, variances 1), moved by training in every member, the same run after run.
  pe::Trainer a(adam(small_config(2, 2)), bn_model(), data().train, data().test);
  const std::vector<float> start = a.model_state();
  CHECK(start == a.model().init_state(2));
  CHECK(start[0] == 0.0f);
  CHECK(start[2 * 6] == 1.0f);  // BatchNorm_0/moving_variance, member 0
  a.run_epoch();
  const std::vector<float> moved = a.model_state();
  for (int m = 0; m < 2; ++m) CHECK(moved[static_cast<std::size_t>(m) * 6] != start[static_cast<std::size_t>(m) * 6]);
  pe::Trainer b(adam(small_config(2, 2)), bn_model(), data().train, data().test);
  b.run_epoch();
  CHECK(b.model_state() == moved);
  CHECK(b.params() == a.params());
  // Saved as "state/<layer>/<name>" (members, C).
  const auto dir = pmap::testing::scratch_dir("state_layers");
  a.save_checkpoint(dir / "a.safetensors");
  const auto f = pmap::io::load_safetensors(dir / "a.safetensors");
  const auto* e = f.find("state/BatchNorm_1/moving_variance");
  REQUIRE(e != nullptr);
  CHECK(e->shape == std::vector<std::int64_t>{2, 8});
  CHECK(f.find("params/BatchNorm_1/beta") != nullptr);
  CHECK(f.find("params/BatchNorm_1/gamma") == nullptr);
}

TEST_CASE("a run with BatchNorm and Dropout resumes bit for bit, and evaluates from its checkpoint") {
  const auto dir = pmap::testing::scratch_dir("state_resume");
  pe::Trainer straight(adam(small_config(2, 2, 2)), bn_model(), data().train, data().test);
  straight.run_epoch();
  straight.save_checkpoint(dir / "one.safetensors");
  const pe::EpochMetrics last = straight.run_epoch();
  pe::Trainer resumed(adam(small_config(2, 2, 2)), bn_model(), data().train, data().test);
  resumed.load_checkpoint(dir / "one.safetensors");
  const pe::EpochMetrics again = resumed.run_epoch();
  CHECK(resumed.params() == straight.params());
  CHECK(resumed.model_state() == straight.model_state());
  CHECK(resumed.optimizer_state("v") == straight.optimizer_state("v"));
  CHECK(again.member_test_accuracy == last.member_test_accuracy);
  // Evaluation from a checkpoint uses its moving statistics: the same accuracy as the run's own evaluation.
  straight.save_checkpoint(dir / "two.safetensors");
  pe::Trainer eval(adam(small_config(1, 2)), bn_model(), data().train, data().test);
  eval.load_members(dir / "two.safetensors", {});
  pe::EpochMetrics m;
  eval.evaluate(m);
  CHECK(m.member_test_accuracy == last.member_test_accuracy);
  CHECK(eval.model_state() == straight.model_state());
  // Member 1 alone: its own statistics.
  pe::Trainer one(adam(small_config(1, 1)), bn_model(), data().train, data().test);
  one.load_members(dir / "two.safetensors", {1});
  pe::EpochMetrics m1;
  one.evaluate(m1);
  CHECK(m1.member_test_accuracy[0] == last.member_test_accuracy[1]);
}

TEST_CASE("BatchNorm and Dropout: members do not depend on placement, data and model parallel match one device") {
  // Members: 2 on 2 devices and 2 on 1 device are the same bits (each member's masks come from its key).
  pe::Trainer spread(adam(small_config(2, 2)), bn_model(), data().train, data().test);
  pe::Trainer packed(adam(small_config(1, 2)), bn_model(), data().train, data().test);
  spread.run_epoch(), packed.run_epoch();
  CHECK(spread.params() == packed.params());
  CHECK(spread.model_state() == packed.model_state());
  // Data parallel on 2 devices: the global batch's statistics (a psum) and the same masks as one device.
  pe::TrainConfig dp = adam(small_config(2, 1)), one = adam(small_config(1, 1));
  dp.mode = pe::Mode::data_parallel;
  pe::Trainer two(dp, bn_model(), data().train, data().test), single(one, bn_model(), data().train, data().test);
  two.run_epoch(), single.run_epoch();
  CHECK(max_abs_diff(two.params(), single.params()) < 1e-4f);  // Adam magnifies rounding in small gradients
  CHECK(max_abs_diff(two.model_state(), single.model_state()) < 1e-5f);
  // Model parallel: Dense_0 column- and Dense_1 row-parallel over 'model', Dropout on the split features.
  pe::TrainConfig mp = adam(small_config(2, 1));
  mp.mode = pe::Mode::model_parallel;
  pe::Trainer split(mp, bn_model(), data().train, data().test);
  REQUIRE(split.plan() != nullptr);
  CHECK(split.plan()->local_params() < split.plan()->full_params());
  split.run_epoch();
  CHECK(max_abs_diff(split.params(), single.params()) < 1e-4f);
  CHECK(max_abs_diff(split.model_state(), single.model_state()) < 1e-5f);
  // The checks can fail: per-device statistics (no psum) would be far off; so is another seed.
  pe::TrainConfig other = one;
  other.seed = 9;
  pe::Trainer seeded(other, bn_model(), data().train, data().test);
  seeded.run_epoch();
  CHECK(max_abs_diff(seeded.params(), single.params()) > 1e-2f);
}

TEST_CASE("bad models and layouts with the new layers are refused, naming what is wrong") {
  // The layers before the first with parameters must keep the batch every member shares, and that layer
  // must read it; Rescaling and Flatten first (Flatten then a copy) train.
  auto model = [](std::vector<std::unique_ptr<pe::Layer>> head) {
    head.push_back(pe::flatten());
    head.push_back(pe::dense("Dense_0", 10));
    return std::make_unique<pe::Sequential>(pe::Dims{12, 12, 1}, std::move(head));
  };
  auto one = [](std::unique_ptr<pe::Layer> a, std::unique_ptr<pe::Layer> b = nullptr) {
    std::vector<std::unique_ptr<pe::Layer>> l;
    l.push_back(std::move(a));
    if (b) l.push_back(std::move(b));
    return l;
  };
  CHECK_THROWS_WITH_AS(model(one(pe::dropout("drop", 0.5f))), doctest::Contains("drop (Dropout(0.5)) comes before"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(model(one(pe::rescaling(0.5f), pe::batch_norm("bn"))),
                       doctest::Contains("bn (BatchNormalization(momentum 0.99, epsilon 0.001)) is the first layer "
                                         "with parameters and cannot read the batch that every member shares"),
                       pmap::ValueError);
  // Rescaling(1, 0) is the identity: with it first, the model trains bit for bit as Flatten-first does.
  pe::Trainer bare(small_config(1, 1), model({}), data().train, data().test);
  pe::Trainer rescaled(small_config(1, 1), model(one(pe::rescaling(1.0f, 0.0f))), data().train, data().test);
  const pe::EpochMetrics mb = bare.run_epoch(), mr = rescaled.run_epoch();
  CHECK(mb.member_test_accuracy[0] > 0.2);  // it learns (10 classes)
  CHECK(rescaled.params() == bare.params());
  CHECK(mr.member_test_accuracy == mb.member_test_accuracy);
  CHECK_THROWS_WITH_AS(pe::dropout("d", 1.0f), doctest::Contains("d: Dropout's rate must be in [0, 1)"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(pe::batch_norm("bn", {.momentum = 1.5f}), doctest::Contains("bn: BatchNormalization needs"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(pe::rescaling(INFINITY), doctest::Contains("finite"), pmap::ValueError);
  pe::TrainConfig mp = small_config(2, 1);
  mp.mode = pe::Mode::model_parallel;
  mp.layout = pe::LayoutMap{};
  mp.layout.add("BatchNorm_0/gamma", pe::PartitionSpec::parse("model"));
  CHECK_THROWS_WITH_AS(pe::Trainer(mp, bn_model(), data().train, data().test),
                       doctest::Contains("BatchNorm_0/gamma (shape (6,)): ('model',): BatchNormalization's weights "
                                         "cannot be split"),
                       pmap::ValueError);
}

TEST_CASE("BatchNorm and Dropout on the CUDA kernels (run on the host): a captured step is the eager step") {
  // The masks read the step counter on the device: every replay of the captured step draws new ones.
  pe::TrainConfig graphs = adam(small_config(1, 2));
  graphs.cuda_kernels_on_host = true;
  pe::TrainConfig eager = graphs;
  eager.graphs = false;
  pe::Trainer g(graphs, bn_model(), data().train, data().test), e(eager, bn_model(), data().train, data().test);
  g.run_epoch(), e.run_epoch();
  CHECK(g.params() == e.params());
  CHECK(g.model_state() == e.model_state());
  // The CPU kernels: the same up to the convolutions' summation order.
  pe::Trainer cpu(adam(small_config(1, 2)), bn_model(), data().train, data().test);
  cpu.run_epoch();
  CHECK(max_abs_diff(cpu.params(), g.params()) < 1e-4f);
  CHECK(max_abs_diff(cpu.model_state(), g.model_state()) < 1e-4f);
}

TEST_CASE("per-member dropout rates: each member trains as it would with its rate for all, and the rates are checked") {
  // The kernel: member m's rate from the (M) array, in place of the layer's.
  const auto& ops = pmap::kernels::cpu_backend().layers();
  pmap::kernels::DropoutParams d;
  d.members = 2, d.rows = 50, d.features = 8, d.rate = 0.5f;
  const std::vector<float> x(800, 1.0f), member_rates{0.0f, 0.25f};
  const std::vector<std::uint32_t> keys{1, 2, 3, 4};
  const std::int64_t step = 2;
  std::vector<float> y(800), y_one(800);
  d.rates = member_rates.data();
  ops.dropout(d, keys.data(), &step, x.data(), y.data());
  CHECK(std::all_of(y.begin(), y.begin() + 400, [](float v) { return v == 1.0f; }));  // rate 0 keeps all
  pmap::kernels::DropoutParams one = d;
  one.rates = nullptr, one.rate = 0.25f;
  ops.dropout(one, keys.data(), &step, x.data(), y_one.data());
  CHECK(std::equal(y.begin() + 400, y.end(), y_one.begin() + 400));
  // The Trainer: member 1 of a run with rates (0.1, 0.6) is member 1 of a run where both have 0.6.
  auto config = [](std::vector<float> rates) {
    pe::TrainConfig c = adam(small_config(2, 2));
    c.dropout = std::move(rates);
    return c;
  };
  pe::Trainer mixed(config({0.1f, 0.6f}), bn_model(), data().train, data().test);
  pe::Trainer high(config({0.6f}), bn_model(), data().train, data().test);
  pe::Trainer low(config({0.1f}), bn_model(), data().train, data().test);
  mixed.run_epoch(), high.run_epoch(), low.run_epoch();
  auto member = [](const pe::Trainer& t, int m) { return pe::member_block(t.model(), t.params(), 2, m, 1); };
  CHECK(member(mixed, 1) == member(high, 1));
  CHECK(member(mixed, 0) == member(low, 0));
  CHECK(member(mixed, 1) != member(low, 1));
  CHECK(mixed.config().to_json()["dropout"] == pmap::io::Json::array({0.1, 0.6}));
  // Checked: a rate outside [0, 1), a list of another length, a model without Dropout, a checkpoint of
  // other rates.
  CHECK_THROWS_WITH_AS(pe::Trainer(config({1.0f}), bn_model(), data().train, data().test),
                       doctest::Contains("--dropout must be in [0, 1), got 1"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pe::Trainer(config({0.1f, 0.2f, 0.3f}), bn_model(), data().train, data().test),
                       doctest::Contains("--dropout gives 3 values for 2 member(s)"), pmap::ValueError);
  pe::TrainConfig flax = small_config(1, 1);
  flax.dropout = {0.2f};
  CHECK_THROWS_WITH_AS(
      pe::Trainer(flax, data().train, data().test),
      doctest::Contains("--dropout sets the rate of the model's Dropout layers, and flax-cnn has none"),
      pmap::ValueError);
  const auto path = pmap::testing::scratch_dir("state_dropout") / "mixed.safetensors";
  mixed.save_checkpoint(path);
  pe::Trainer other(adam(small_config(2, 2)), bn_model(), data().train, data().test);
  CHECK_THROWS_WITH_AS(other.load_checkpoint(path),
                       doctest::Contains("written with dropout = [0.1,0.6], this run has null"), pmap::DataError);
}

}  // namespace PMAPCC_TEST_FILE
