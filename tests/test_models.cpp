// Models as inputs: Conv2D's Keras options (stride, valid padding, no bias), GlobalAveragePooling2D, Keras's
// summary table, the model registry, and the Trainer training a model of the caller's (its gradients
// against central differences, the data's shape and classes checked, the architecture recorded and checked
// in checkpoints, model parallelism of a model with a bias-less convolution).
#include <doctest/doctest.h>

#include <cmath>

#include <pmapcc/ensemble/runner.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/kernels/cpu_backend.h>
#include "kernel_checks.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace pe = pmap::ensemble;
namespace kc = kernel_checks;

namespace {

using pmap::testing::small_config;

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

// Every new piece at once on 12x12 images: a strided valid conv, an even-kernel SAME conv without bias
// (its padding asymmetric: the extra row and column after), global average pooling, a dense head.
std::unique_ptr<pe::Sequential> keras_like(int classes = 10) {
  std::vector<std::unique_ptr<pe::Layer>> l;
  l.push_back(
      pe::conv2d("Conv_0", 8, pe::Conv2dOptions{.kernel = 3, .stride = 2, .padding = pmap::kernels::Padding::valid}));
  l.push_back(pe::relu());
  l.push_back(pe::conv2d("Conv_1", 12, pe::Conv2dOptions{.kernel = 2, .use_bias = false}));
  l.push_back(pe::relu());
  l.push_back(pe::global_avg_pool());
  l.push_back(pe::dense("Dense_0", classes));
  return std::make_unique<pe::Sequential>(pe::Dims{12, 12, 1}, std::move(l), "keras-like");
}

}  // namespace

TEST_CASE("Conv2D's options give Keras's shapes and parameters, and name themselves") {
  const pe::Dims in{28, 28, 1};
  auto shape = [&](pe::Conv2dOptions o) { return pe::conv2d("c", 4, o)->output_shape(in); };
  CHECK(shape({}) == pe::Dims{28, 28, 4});
  CHECK(shape({.kernel = 6, .stride = 2}) == pe::Dims{14, 14, 4});  // same: ceil(28 / 2)
  CHECK(shape({.kernel = 3, .stride = 2, .padding = pmap::kernels::Padding::valid}) == pe::Dims{13, 13, 4});
  CHECK(shape({.kernel = 5, .padding = pmap::kernels::Padding::valid}) == pe::Dims{24, 24, 4});
  CHECK(pe::conv2d("c", 4, pe::Conv2dOptions{.kernel = 6, .use_bias = false})->params(in).size() == 1);
  CHECK(pe::conv2d(
            "c", 4,
            pe::Conv2dOptions{.kernel = 6, .stride = 2, .padding = pmap::kernels::Padding::valid, .use_bias = false})
            ->describe() == "Conv2D(4, 6x6, stride 2, valid, no bias)");
  CHECK_THROWS_WITH_AS(pe::conv2d("c", 4, pe::Conv2dOptions{.kernel = 5, .padding = pmap::kernels::Padding::valid})
                           ->output_shape({3, 3, 1}),
                       doctest::Contains("c: Conv2D(4, 5x5, valid) on (3, 3, 1) inputs"), pmap::ShapeError);
  CHECK_THROWS_WITH_AS(pe::conv2d("c", 4, pe::Conv2dOptions{.stride = 0}), doctest::Contains("stride >= 1"),
                       pmap::ValueError);
  CHECK(pe::global_avg_pool()->output_shape({7, 7, 32}) == pe::Dims{32});
}

TEST_CASE("GlobalAveragePooling2D gives each channel's mean, and spreads its gradient evenly") {
  const auto& be = pmap::kernels::cpu_backend();
  const auto gap = pe::global_avg_pool();
  // 2 members, 1 example of (2, 2, 3): channel c of member m holds m*100 + c*10 + pixel.
  std::vector<float> x(2 * 4 * 3), y(2 * 3), dx(x.size());
  for (int m = 0; m < 2; ++m)
    for (int p = 0; p < 4; ++p)
      for (int c = 0; c < 3; ++c)
        x[static_cast<std::size_t>((m * 4 + p) * 3 + c)] = static_cast<float>(m * 100 + c * 10 + p);
  const pe::LayerCall call{2, 1, {2, 2, 3}};
  gap->forward(be, call, nullptr, x.data(), y.data(), nullptr);
  CHECK(y == std::vector<float>{1.5f, 11.5f, 21.5f, 101.5f, 111.5f, 121.5f});
  const std::vector<float> dy{4, 8, 12, 16, 20, 24};
  gap->backward(be, call, nullptr, x.data(), y.data(), dy.data(), dx.data(), nullptr, nullptr);
  for (int m = 0; m < 2; ++m)
    for (int p = 0; p < 4; ++p)
      for (int c = 0; c < 3; ++c)
        CHECK(dx[static_cast<std::size_t>((m * 4 + p) * 3 + c)] == dy[static_cast<std::size_t>(m * 3 + c)] / 4);
}

TEST_CASE("the new layers' gradients (strided, valid, bias-less Conv2D, global pooling) match central differences") {
  // Each layer alone under a linear objective sum(r * y), whose central differences are exact up to float
  // rounding (a whole model's ReLU kinks and softmax curvature would blur them): dparams and dx.
  const auto& be = pmap::kernels::cpu_backend();
  using pmap::kernels::Padding;
  struct Case {
    const char* what;
    std::unique_ptr<pe::Layer> layer;
    pe::Dims input;
    bool shared;
  };
  std::vector<Case> cases;
  cases.push_back({"Conv2D 3x3 stride 2 valid, shared input",
                   pe::conv2d("c", 5, {.kernel = 3, .stride = 2, .padding = Padding::valid}),
                   {9, 8, 1},
                   true});
  cases.push_back({"Conv2D 2x2 same (padding after), no bias",
                   pe::conv2d("c", 4, {.kernel = 2, .use_bias = false}),
                   {5, 6, 3},
                   false});
  cases.push_back({"Conv2D 6x6 stride 2 same, no bias",
                   pe::conv2d("c", 3, {.kernel = 6, .stride = 2, .use_bias = false}),
                   {9, 9, 2},
                   false});
  cases.push_back({"GlobalAveragePooling2D", pe::global_avg_pool(), {3, 5, 4}, false});
  for (Case& c : cases) {
    CAPTURE(c.what);
    const int members = 2, batch = 3;
    const pe::LayerCall call{members, batch, c.input, c.shared};
    const auto in_n = static_cast<std::size_t>((c.shared ? 1 : members) * batch * pe::product(c.input));
    const auto out_n = static_cast<std::size_t>(members * batch * pe::product(c.layer->output_shape(c.input)));
    std::vector<float> x = kc::random_floats(in_n, 11), r = kc::random_floats(out_n, 12), y(out_n), dx(in_n);
    std::vector<std::vector<float>> p, dp;
    std::uint32_t seed = 13;
    for (const pe::ParamSpec& s : c.layer->params(c.input)) {
      p.push_back(kc::random_floats(static_cast<std::size_t>(members * pe::product(s.shape)), seed++));
      dp.emplace_back(p.back().size());
    }
    std::vector<const float*> pp;
    std::vector<float*> dpp;
    for (std::size_t k = 0; k < p.size(); ++k) pp.push_back(p[k].data()), dpp.push_back(dp[k].data());
    std::vector<std::byte> ws(c.layer->workspace_bytes(be, call) + 1);
    auto objective = [&] {
      c.layer->forward(be, call, pp.data(), x.data(), y.data(), ws.data());
      return kc::weighted_sum(y, r);
    };
    objective();
    c.layer->backward(be, call, pp.data(), x.data(), y.data(), r.data(), dx.data(), dpp.data(), ws.data());
    kc::check_grad("dx", dx, kc::numeric_grad(x, objective, 0.05f));
    for (std::size_t k = 0; k < p.size(); ++k)
      kc::check_grad("dparams", dp[k], kc::numeric_grad(p[k], objective, 0.05f));
  }
}

TEST_CASE("summary() prints Keras's table, and the registry builds models by name") {
  const auto cnn = pe::make_model("flax-cnn", {28, 28, 1}, 10);
  const std::string s = cnn->summary();
  for (const char* line :
       {"Model: \"flax-cnn\"\n", "| Layer (type)", "Output Shape", "Param # |\n",
        "| Conv_1 (Conv2D(64, 3x3))       | (None, 14, 14, 64) |  18,496 |\n",
        "| flatten (Flatten)              | (None, 3136)       |       0 |\n", " Total params: 824,458 (3.15 MB)\n",
        " Trainable params: 824,458 (3.15 MB)\n", " Non-trainable params: 0 (0.00 B)\n"}) {
    CAPTURE(line);
    CHECK(s.find(line) != std::string::npos);
  }
  CHECK(cnn->architecture()[0] == "(28, 28, 1)");
  CHECK(cnn->architecture()[1] == "Conv_0=Conv2D(32, 3x3)");
  CHECK(cnn->architecture()[3] == "avg_pool=AveragePooling2D(2)");
  CHECK(pe::model_names() == std::vector<std::string>{"flax-cnn", "keras-convnet"});
  CHECK_THROWS_WITH_AS(pe::make_model("resnet", {28, 28, 1}, 10),
                       doctest::Contains("--model must be one of flax-cnn, keras-convnet, got 'resnet'"), pmap::ValueError);
}

TEST_CASE("the Trainer trains a model of the caller's as an ensemble, bit for bit run after run") {
  pe::Trainer a(small_config(2, 2), keras_like(), data().train, data().test);
  pe::Trainer b(small_config(2, 2), keras_like(), data().train, data().test);
  const pe::EpochMetrics ma = a.run_epoch(), mb = b.run_epoch();
  CHECK(a.params() == b.params());
  CHECK(ma.member_test_accuracy == mb.member_test_accuracy);
  CHECK(std::isfinite(ma.train_loss));
  CHECK(a.config().model == "keras-like");
  CHECK(a.config().to_json()["architecture"] == pmap::io::Json(a.model().architecture()));
  // Data parallel on 2 devices is one device up to float reassociation.
  pe::TrainConfig dp = small_config(2, 1), one = small_config(1, 1);
  dp.mode = pe::Mode::data_parallel;
  pe::Trainer two(dp, keras_like(), data().train, data().test), single(one, keras_like(), data().train, data().test);
  two.run_epoch(), single.run_epoch();
  CHECK(pmap::testing::max_abs_diff(two.params(), single.params()) < 1e-5f);
}

TEST_CASE("a model that does not fit the data, or a checkpoint of another architecture, is refused") {
  CHECK_THROWS_WITH_AS(
      pe::Trainer(small_config(1, 1), pe::flax_mnist_cnn({28, 28, 1}, 10), data().train, data().test),
      doctest::Contains("--model flax-cnn takes (28, 28, 1) inputs; the data's images are (12, 12, 1)"),
      pmap::ValueError);
  CHECK_THROWS_WITH_AS(pe::Trainer(small_config(1, 1), keras_like(4), data().train, data().test),
                       doctest::Contains("gives 4 outputs; the data has 10 classes"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(pe::Trainer(small_config(1, 1), nullptr, data().train, data().test),
                       doctest::Contains("no model"), pmap::ValueError);
  const auto path = pmap::testing::scratch_dir("pmapcc_models_test") / "keras_like.safetensors";
  {
    pe::Trainer t(small_config(1, 1), keras_like(), data().train, data().test);
    t.run_epoch();
    t.save_checkpoint(path);
  }
  // Same name and tensors, but the first conv's stride differs: its tensors have the same shapes.
  std::vector<std::unique_ptr<pe::Layer>> l;
  l.push_back(
      pe::conv2d("Conv_0", 8, pe::Conv2dOptions{.kernel = 3, .stride = 1, .padding = pmap::kernels::Padding::valid}));
  l.push_back(pe::relu());
  l.push_back(pe::conv2d("Conv_1", 12, pe::Conv2dOptions{.kernel = 2, .use_bias = false}));
  l.push_back(pe::relu());
  l.push_back(pe::global_avg_pool());
  l.push_back(pe::dense("Dense_0", 10));
  pe::Trainer other(small_config(1, 1),
                    std::make_unique<pe::Sequential>(pe::Dims{12, 12, 1}, std::move(l), "keras-like"), data().train,
                    data().test);
  CHECK_THROWS_WITH_AS(other.load_checkpoint(path),
                       doctest::Contains("the checkpoint's model has layer 0 Conv_0=Conv2D(8, 3x3, stride 2, valid, relu) "
                                         "where this run's has Conv_0=Conv2D(8, 3x3, valid, relu)"),
                       pmap::DataError);
  pe::Trainer same(small_config(1, 1), keras_like(), data().train, data().test);
  same.load_checkpoint(path);
  CHECK(same.epochs_done() == 1);
}

TEST_CASE("model parallelism of a model with a bias-less convolution matches one device") {
  pe::TrainConfig split = small_config(2, 1), one = small_config(1, 1);
  split.mode = pe::Mode::model_parallel;
  split.layout = pe::LayoutMap{};
  split.layout.add("Conv_1/kernel", pe::PartitionSpec::parse("None,None,None,model"));  // column-parallel, no bias
  pe::Trainer mp(split, keras_like(), data().train, data().test), single(one, keras_like(), data().train, data().test);
  CHECK(mp.plan()->local_params() < mp.plan()->full_params());
  mp.run_epoch(), single.run_epoch();
  CHECK(pmap::testing::max_abs_diff(mp.params(), single.params()) < 1e-5f);
}

}  // namespace PMAPCC_TEST_FILE
