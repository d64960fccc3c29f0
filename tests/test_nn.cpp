// The modules of pmap::nn (pmapcc/nn/layers.h, pmapcc/nn/normalization.h): their variables as init draws
// them, their calls against the ops they stand for and against host arithmetic, BatchNorm's state in
// training and inference and over a data axis, Dropout's masks, gradients through them, and every error.
#include "cuda_testing.h"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/core/grad.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/nn/init.h>
#include <pmapcc/nn/layers.h>
#include <pmapcc/nn/normalization.h>
#include <pmapcc/nn/summary.h>
#include <pmapcc/train/model.h>

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using cuda_testing::random_floats;
using pmap::Array;
using pmap::Shape;
namespace nn = pmap::nn;
namespace ops = pmap::ops;

Array host(const std::vector<float>& v, Shape shape) { return Array::from_host(v, std::move(shape)); }

// Per channel of x (rows, C): the mean and the biased variance, in double.
std::pair<std::vector<double>, std::vector<double>> moments(const std::vector<float>& x, int rows, int c) {
  std::vector<double> mean(static_cast<std::size_t>(c)), var(static_cast<std::size_t>(c));
  for (int k = 0; k < c; ++k) {
    double s = 0, q = 0;
    for (int i = 0; i < rows; ++i) {
      const double v = x[static_cast<std::size_t>(i * c + k)];
      s += v, q += v * v;
    }
    mean[static_cast<std::size_t>(k)] = s / rows;
    var[static_cast<std::size_t>(k)] = q / rows - (s / rows) * (s / rows);
  }
  return {mean, var};
}

}  // namespace

TEST_CASE("nn: Dense and Conv draw their kernels as the initializers do, and call the ops they stand for") {
  const pmap::Key key = pmap::key(11);
  const nn::Dense dense{.features = 5};
  const auto dp = dense.init(key, 4);
  CHECK(dp.kernel.shape() == Shape{4, 5});
  CHECK(dp.kernel.to_vector<float>() == nn::lecun_normal(key, {4, 5}, 4).to_vector<float>());
  CHECK(dp.bias.to_vector<float>() == std::vector<float>(5, 0.0f));
  const Array x = host(random_floats(12, 3), {3, 4});
  CHECK(dense(dp, x, true).to_vector<float>() == ops::linear(x, dp.kernel, dp.bias, true).to_vector<float>());

  const nn::Conv conv{.features = 6, .kernel_h = 2, .kernel_w = 3, .stride_h = 2, .same = false,
                      .kernel_init = nn::Init::glorot_uniform};
  const auto full = conv.init(key, 2);
  const auto bare = conv.init_kernel(key, 2);
  CHECK(full.kernel.shape() == Shape{2, 3, 2, 6});
  CHECK(bare.kernel.to_vector<float>() == full.kernel.to_vector<float>());  // the same draw, without the bias
  const double limit = std::sqrt(6.0 / (6 * 2 + 6 * 6));
  for (float w : bare.kernel.to_vector<float>()) CHECK(std::abs(w) <= limit);
  const Array img = host(random_floats(2 * 5 * 6 * 2, 4), {2, 5, 6, 2});
  const auto with_zero_bias = conv(full, img).to_vector<float>();
  CHECK(conv(bare, img).to_vector<float>() == with_zero_bias);
  CHECK(conv(bare, img).shape() == Shape{2, 2, 4, 6});
}

TEST_CASE("nn: BatchNorm normalizes with the batch in training and moves its state, inference uses the state") {
  const int rows = 16, c = 3;
  const auto xs = random_floats(rows * c, 21, -2.0f, 3.0f);
  const Array x = host(xs, {4, 4, c});  // every axis but the last is a row
  const nn::BatchNorm bn{.momentum = 0.9f, .epsilon = 1e-3f};
  auto p = bn.init(c);
  CHECK(p.gamma.to_vector<float>() == std::vector<float>(3, 1.0f));
  CHECK(p.beta.to_vector<float>() == std::vector<float>(3, 0.0f));
  p.gamma = host({1.0f, 2.0f, 0.5f}, {3});
  p.beta = host({0.0f, -1.0f, 0.25f}, {3});
  const auto s0 = bn.init_state(c);
  CHECK(s0.moving_mean.to_vector<float>() == std::vector<float>(3, 0.0f));
  CHECK(s0.moving_variance.to_vector<float>() == std::vector<float>(3, 1.0f));

  auto [y, s1] = bn(p, s0, x, {.train = true});
  const auto [mean, var] = moments(xs, rows, c);
  const auto ys = y.to_vector<float>();
  const std::vector<double> gamma{1, 2, 0.5}, beta{0, -1, 0.25};
  for (int i = 0; i < rows; ++i) {
    for (int k = 0; k < c; ++k) {
      const auto j = static_cast<std::size_t>(i * c + k), kk = static_cast<std::size_t>(k);
      const double want = (xs[j] - mean[kk]) / std::sqrt(var[kk] + 1e-3) * gamma[kk] + beta[kk];
      CHECK(ys[j] == doctest::Approx(want).epsilon(1e-5));
    }
  }
  for (int k = 0; k < c; ++k) {
    const auto kk = static_cast<std::size_t>(k);
    CHECK(s1.moving_mean.to_vector<float>()[kk] == doctest::Approx(0.1 * mean[kk]).epsilon(1e-5));
    CHECK(s1.moving_variance.to_vector<float>()[kk] == doctest::Approx(0.9 + 0.1 * var[kk]).epsilon(1e-5));
  }
  // inference: the moving statistics, returned unchanged; the fused ReLU
  auto [yi, s2] = bn(p, s1, x, {.train = false, .relu = true});
  CHECK(s2.moving_mean.to_vector<float>() == s1.moving_mean.to_vector<float>());
  const auto mm = s1.moving_mean.to_vector<float>(), mv = s1.moving_variance.to_vector<float>();
  const auto yis = yi.to_vector<float>();
  for (int i = 0; i < rows; ++i) {
    for (int k = 0; k < c; ++k) {
      const auto j = static_cast<std::size_t>(i * c + k), kk = static_cast<std::size_t>(k);
      const double want = std::max(0.0, (xs[j] - mm[kk]) / std::sqrt(mv[kk] + 1e-3) * gamma[kk] + beta[kk]);
      CHECK(yis[j] == doctest::Approx(want).epsilon(1e-5).scale(1e-6));
    }
  }
  // center only (Keras's scale=False): the offset's gradient of sum(y) is the row count per channel
  const nn::BatchNorm keras{};
  const auto center = keras.init_center(c);
  auto g = pmap::grad([&](const nn::BatchNormCenter& pc) {
    return ops::sum(keras(pc, keras.init_state(c), x, {.train = true}).first);
  })(center);
  for (float v : g.beta.to_vector<float>()) CHECK(v == doctest::Approx(rows));
}

TEST_CASE("nn: BatchNorm over a data axis normalizes with the global batch on 1, 2 and 4 devices") {
  const int rows = 8, c = 2;
  const auto xs = random_floats(rows * c, 41);
  const nn::BatchNorm bn{.axis_name = {"data"}};
  auto [whole, whole_state] = nn::BatchNorm{}(bn.init(c), bn.init_state(c), host(xs, {rows, c}), {.train = true});
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), "data");
    auto out = pmap::pmap([&](const Array& x) {
      const pmap::Device d = pmap::current_device();
      auto [y, s] = bn(bn.init(c, d), bn.init_state(c, d), x, {.train = true});
      return std::make_pair(y.to_vector<float>(), s.moving_variance.to_vector<float>());
    }, mesh)(pmap::shard(host(xs, {rows, c}), mesh));
    std::vector<float> y;
    for (const auto& [part, state] : out) {
      y.insert(y.end(), part.begin(), part.end());
      CHECK(cuda_testing::relative_error(state, whole_state.moving_variance.to_vector<float>()) < 1e-6);
    }
    CHECK(cuda_testing::relative_error(y, whole.to_vector<float>()) < 1e-5);
  }
}

TEST_CASE("nn: Dropout keeps or scales each value, by the step's key and the example's global index") {
  const auto xs = random_floats(40, 51, 0.5f, 1.5f);
  const Array x = host(xs, {10, 4});
  const Array key = Array::from_host(std::vector<std::uint32_t>{3, 4}, {2});
  const Array step = Array::from_host(std::vector<std::int64_t>{7}, {1});
  const nn::Rng rng{&key, &step, 0};
  const nn::Dropout drop{.rate = 0.25f};
  CHECK(drop(x, {}).to_vector<float>() == xs);  // inference: x itself
  const auto y = drop(x, {.train = true, .rng = rng}).to_vector<float>();
  int zeros = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0.0f) {
      ++zeros;
    } else {
      CHECK(y[i] == doctest::Approx(xs[i] / 0.75f));
    }
  }
  CHECK(zeros > 0);
  CHECK(zeros < 40);
  CHECK(drop(x, {.train = true, .rng = rng}).to_vector<float>() == y);  // the same masks again
  CHECK(nn::Dropout{.rate = 0.25f, .stream = 1}(x, {.train = true, .rng = rng}).to_vector<float>() != y);
  nn::Rng later = rng;
  later.example_offset = 5;  // rows 5..9 alone draw what they draw inside the whole batch
  const auto tail = drop(host(std::vector<float>(xs.begin() + 20, xs.end()), {5, 4}), {.train = true, .rng = later});
  CHECK(tail.to_vector<float>() == std::vector<float>(y.begin() + 20, y.end()));
  const nn::DropoutCall training_without_rng{.train = true, .rng = {}};
  CHECK(nn::Dropout{.rate = 0.0f}(x, training_without_rng).to_vector<float>() == xs);
  // A rate read on the device (a hyper-parameter ensemble member's) in place of the layer's: the bits of a layer
  // of that rate, in the forward and the gradient, and nothing in inference.
  const Array rate = Array::from_host(std::vector<float>{0.6f}, {1});
  const auto at_06 = nn::Dropout{.rate = 0.6f}(x, {.train = true, .rng = rng}).to_vector<float>();
  CHECK(drop(x, {.train = true, .rng = rng, .rate = &rate}).to_vector<float>() == at_06);
  CHECK(drop(x, {.train = false, .rng = rng, .rate = &rate}).to_vector<float>() == xs);
  const Array w = host(random_floats(40, 52), {10, 4});
  auto grad_of = [&](const nn::DropoutCall& call) {
    return pmap::grad([&](const Array& xx) { return ops::sum(ops::multiply(drop(xx, call), w)); })(x);
  };
  CHECK(grad_of({.train = true, .rng = rng, .rate = &rate}).to_vector<float>() ==
        nn::Dropout{.rate = 0.6f}(w, {.train = true, .rng = rng}).to_vector<float>());
  const Array two = Array::from_host(std::vector<float>{0.6f, 0.1f}, {2});
  CHECK_THROWS_WITH_AS(drop(x, {.train = true, .rng = rng, .rate = &two}), doctest::Contains("must hold one value"),
                       pmap::ShapeError);
}

TEST_CASE("nn: bad hyper-parameters and missing randomness raise ValueError naming the module") {
  CHECK_THROWS_WITH_AS(nn::Dense{}.init(pmap::key(0), 3), doctest::Contains("nn::Dense: features must be positive"),
                       pmap::ValueError);
  const nn::Conv narrow{.features = 2, .kernel_w = 0};
  CHECK_THROWS_WITH_AS(narrow.init_kernel(pmap::key(0), 3),
                       doctest::Contains("nn::Conv: the kernel width must be positive"), pmap::ValueError);
  CHECK_THROWS_WITH_AS(nn::BatchNorm{}.init_state(0), doctest::Contains("nn::BatchNorm: the channels"),
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(nn::BatchNorm{}.init_center(-2), doctest::Contains("got -2"), pmap::ValueError);
  const Array x = host({1, 2, 3, 4}, {2, 2});
  const nn::Dropout all{.rate = 1.0f};
  CHECK_THROWS_WITH_AS(all(x, nn::DropoutCall{}), doctest::Contains("nn::Dropout: rate must be in [0, 1)"),
                       pmap::ValueError);
  const nn::DropoutCall training_without_rng{.train = true, .rng = {}};
  CHECK_THROWS_WITH_AS(nn::Dropout{}(x, training_without_rng), doctest::Contains("needs DropoutCall::rng's key"),
                       pmap::ValueError);
}

// A user's model for the summary: Dense_0 called twice (a residual block with shared weights), a scale read by
// ops alone, and a Dense whose kernel is made inside apply (none of the model's tensors).
struct Residual {
  nn::DenseParams Dense_0;
  Array scale;
};
PMAPCC_TREE(Residual, Dense_0, scale)

namespace {

// The summary's box rows: {"name (description)", "output shape", "count"} each, in order.
std::vector<std::vector<std::string>> summary_rows(const std::string& summary) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(summary);
  std::string line;
  int boxes = 0;
  while (std::getline(lines, line)) {
    if (line.starts_with("+")) ++boxes;
    if (boxes != 2 || !line.starts_with("|")) continue;  // the rows lie between the 2nd and 3rd lines of dashes
    std::vector<std::string> cells;
    std::istringstream parts(line.substr(1));
    std::string cell;
    while (std::getline(parts, cell, '|')) {
      const auto first = cell.find_first_not_of(' '), last = cell.find_last_not_of(' ');
      cells.push_back(first == std::string::npos ? "" : cell.substr(first, last - first + 1));
    }
    rows.push_back(cells);
  }
  return rows;
}

// The elements of the tensors of `vars` named `prefix/...`.
std::int64_t elements(const pmap::train::Variables& vars, const std::string& prefix) {
  std::int64_t n = 0;
  for (const auto& [name, a] : vars)
    if (name.starts_with(prefix + "/")) n += a.size();
  return n;
}

// The same count as the summary writes it ("18,496").
std::string count(const pmap::train::Variables& params, const std::string& prefix) {
  std::string digits = std::to_string(elements(params, prefix)), out;
  for (std::size_t i = 0; i < digits.size(); ++i) out += (i > 0 && (digits.size() - i) % 3 == 0 ? "," : "") +
                                                          std::string(1, digits[i]);
  return out;
}

}  // namespace

TEST_CASE("nn: a model's summary has a row per module call, with its output shape and the tensors it read") {
  namespace train = pmap::train;
  SUBCASE("flax-cnn: the convolutions with their fused ReLU, the Dense layers; pooling is an op, not a row") {
    const train::Model model = train::flax_cnn({28, 28, 1});
    const auto params = model.init(pmap::key(0)).first;
    const std::string summary = model.summary();
    CHECK(summary.starts_with("Model: \"flax-cnn\"\n"));
    const std::vector<std::vector<std::string>> expected{
        {"Conv_0 (Conv2D(32, 3x3, relu))", "(None, 28, 28, 32)", count(params, "Conv_0")},
        {"Conv_1 (Conv2D(64, 3x3, relu))", "(None, 14, 14, 64)", count(params, "Conv_1")},
        {"Dense_0 (Dense(256, relu))", "(None, 256)", count(params, "Dense_0")},
        {"Dense_1 (Dense(10))", "(None, 10)", count(params, "Dense_1")}};
    CHECK(summary_rows(summary) == expected);
    CHECK(summary.ends_with(" Total params: 824,458 (3.15 MB)\n Trainable params: 824,458 (3.15 MB)\n"
                            " Non-trainable params: 0 (0.00 B)\n"));
  }
  SUBCASE("keras-convnet: BatchNorm's moving statistics counted in its row and as non-trainable, Dropout's row") {
    const train::Model model = train::keras_convnet({28, 28, 1});
    const auto [params, state] = model.init(pmap::key(0));
    const std::vector<std::vector<std::string>> rows = summary_rows(model.summary());
    REQUIRE(rows.size() == 9);
    CHECK(rows[0] == std::vector<std::string>{"Conv_0 (Conv2D(12, 3x3, no bias))", "(None, 28, 28, 12)", "108"});
    // BatchNorm's row: its 12 offsets and 24 moving statistics.
    CHECK(elements(params, "BatchNorm_0") + elements(state, "BatchNorm_0") == 36);
    CHECK(rows[1] == std::vector<std::string>{
                         "BatchNorm_0 (BatchNormalization(momentum 0.99, epsilon 0.001, no scale, relu))",
                         "(None, 28, 28, 12)", "36"});
    CHECK(rows[2] == std::vector<std::string>{"Conv_1 (Conv2D(24, 6x6, stride 2, valid, no bias))",
                                              "(None, 12, 12, 24)", count(params, "Conv_1")});
    CHECK(rows[4] == std::vector<std::string>{"large_k (Conv2D(32, 6x6, stride 2))", "(None, 6, 6, 32)",
                                              count(params, "large_k")});
    CHECK(rows[6] == std::vector<std::string>{"Dense_0 (Dense(256, relu))", "(None, 256)", count(params, "Dense_0")});
    CHECK(rows[7] == std::vector<std::string>{"dropout (Dropout(0.5))", "(None, 256)", "0"});
    CHECK(rows[8] == std::vector<std::string>{"Dense_1 (Dense(10))", "(None, 10)", count(params, "Dense_1")});
    std::int64_t moving = 0;
    for (const auto& [name, a] : state) moving += a.size();
    CHECK(moving == 136);
    CHECK(model.summary().find(" Non-trainable params: 136 (544.00 B)\n") != std::string::npos);
  }
  SUBCASE("a user's model: a module called twice, a tensor read by ops alone, a module on tensors of its own") {
    const nn::Dense square{.features = 4}, head{.features = 2};
    const train::Model model = train::make_model<Residual>(
        "residual", {2, 2, 1}, 2,
        [=](pmap::Key key, const pmap::Device& d) {
          return std::pair{Residual{square.init(key, 4, d), nn::ones({4}, d)}, train::NoState{}};
        },
        [=](const Residual& p, const train::NoState& s, const Array& x, const train::Call&) {
          const Array flat = ops::reshape(x, {x.dim(0), 4});
          const Array h = ops::add(flat, square(p.Dense_0, square(p.Dense_0, flat, /*relu=*/true)));
          const nn::DenseParams made{nn::zeros({4, 2}), nn::zeros({2})};
          return std::pair{head(made, ops::multiply(h, ops::broadcast_to(p.scale, h.shape()))), s};
        });
    const std::vector<std::vector<std::string>> expected{{"Dense_0 (Dense(4, relu))", "(None, 4)", "20"},
                                                         {"Dense_0 (Dense(4))", "(None, 4)", "20"},
                                                         {"dense (Dense(2))", "(None, 2)", "0"},
                                                         {"scale (not read by a module)", "", "4"}};
    CHECK(summary_rows(model.summary()) == expected);
    CHECK(model.summary().find(" Total params: 24 (96.00 B)\n") != std::string::npos);
  }
  SUBCASE("recorders nest, and record nothing once gone") {
    const nn::Dense dense{.features = 3};
    const nn::DenseParams p = dense.init(pmap::key(1), 2);
    const Array x = host({1, 2}, {1, 2});
    CHECK_FALSE(nn::recording_modules());
    {
      nn::ModuleRecorder outer;
      (void)dense(p, x);
      {
        nn::ModuleRecorder inner;
        CHECK(nn::recording_modules());
        (void)dense(p, x, /*relu=*/true);
        REQUIRE(inner.calls().size() == 1);
        CHECK(inner.calls()[0].description == "Dense(3, relu)");
        CHECK(inner.calls()[0].output == Shape{1, 3});
        CHECK(inner.calls()[0].tensors == std::vector<const void*>{p.kernel.raw_data(), p.bias.raw_data()});
      }
      (void)nn::Dropout{.rate = 0.25f}(x, {});
      REQUIRE(outer.calls().size() == 2);
      CHECK(outer.calls()[0].description == "Dense(3)");
      CHECK(outer.calls()[1].description == "Dropout(0.25)");
      CHECK(outer.calls()[1].tensors.empty());
    }
    CHECK_FALSE(nn::recording_modules());  // gone: a module call records nowhere
    (void)dense(p, x);
  }
}

}  // namespace PMAPCC_TEST_FILE
