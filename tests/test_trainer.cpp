// train::Trainer's members at their start and over a first epoch: flax-cnn's members start as Flax's
// lecun_normal draws them (a normal truncated at 2 sigma, scaled to std sqrt(1 / fan_in), zero biases), each
// from its own key whatever the devices; the first loss is log(10) and the loss falls within the epoch; and
// reading the per-step losses every few steps changes no result, every step still reported in order.
// (Determinism, resuming, data parallelism and evaluation are tests/test_train_trainer.cpp's and
// tests/test_train_checkpoint.cpp's.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace train = pmap::train;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

using pmap::testing::stacked;

pmap::Mesh cpu_mesh(int devices) { return pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "ensemble"); }

// The Flax example's optimizer: SGD at 0.1 with momentum 0.9.
const train::Optimizer& sgd() {
  static const train::Optimizer o(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f});
  return o;
}

}  // namespace

TEST_CASE("trainer: flax-cnn's members start LeCun-normal as in Flax, each from its own key, on any devices") {
  const train::Model cnn = train::flax_cnn({12, 12, 1});
  train::Trainer spread(cnn, sgd(), cpu_mesh(3), {.members = 3}), packed(cnn, sgd(), cpu_mesh(1), {.members = 3});
  const train::Variables p = spread.params();
  // A member's start depends on its key only: the same members on 1 device as on 3.
  CHECK(stacked(packed.params(), cnn.param_names()) == stacked(p, cnn.param_names()));
  for (const std::string& name : cnn.param_names()) {
    CAPTURE(name);
    const pmap::Array& a = p.at(name);
    REQUIRE(a.dim(0) == 3);
    const std::vector<float> all = a.to_vector<float>();
    const std::size_t size = all.size() / 3;
    auto member = [&](std::size_t g) {
      return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(g * size),
                                all.begin() + static_cast<std::ptrdiff_t>((g + 1) * size));
    };
    if (a.shape().size() == 2) {  // a bias (members, features): zeros
      CHECK(name.ends_with("/bias"));
      CHECK(std::all_of(all.begin(), all.end(), [](float v) { return v == 0.0f; }));
      continue;
    }
    // A kernel (members, ..., in, out): its fan-in is every dimension but the members' and the outputs'.
    std::int64_t fan_in = 1;
    for (std::size_t d = 1; d + 1 < a.shape().size(); ++d) fan_in *= a.dim(d);
    // Flax's lecun_normal: a standard normal truncated to [-2, 2], scaled to stddev sqrt(1 / fan_in) (the scale
    // divides by 0.8796..., the truncated normal's own stddev).
    const double sigma = std::sqrt(1.0 / static_cast<double>(fan_in));
    const double bound = 2.0 * sigma / 0.87962566103423978;
    for (std::size_t g = 0; g < 3; ++g) {
      CAPTURE(g);
      const std::vector<float> w = member(g);
      double sum = 0, sq = 0, peak = 0;
      for (const float x : w) {
        sum += x, sq += static_cast<double>(x) * x, peak = std::max(peak, std::abs(static_cast<double>(x)));
      }
      const double n = static_cast<double>(w.size()), mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
      // Tolerances of 5 standard errors of each estimate (std error of the std ~ sigma * 0.55 / sqrt(n) for
      // this truncated normal; of the mean, sigma / sqrt(n)).
      CHECK(std::abs(stddev / sigma - 1.0) <= 5 * 0.55 / std::sqrt(n) + 1e-3);
      CHECK(std::abs(mean) <= 5 * sigma / std::sqrt(n));
      CHECK(peak <= bound * (1 + 1e-6));
      CHECK(peak >= 0.8 * bound);  // the tails are there, cut at the bound
    }
    CHECK(member(0) != member(1));  // each member from its own key
    CHECK(member(1) != member(2));
  }
}

TEST_CASE("trainer: the first loss is log(10), the loss falls, and reading it every 3 steps changes no result") {
  // One member, 10 steps of 64 on the synthetic data (a bright square's place is the label).
  const train::Model cnn = train::flax_cnn({12, 12, 1});
  train::Trainer one(cnn, sgd(), cpu_mesh(1), {.batch_size = 64});
  std::vector<double> losses;
  one.run_epoch(data().train, [&](const train::StepReport& r) { losses.push_back(r.loss); });
  REQUIRE(losses.size() == 10);  // 640 / 64
  // At initialization the logits are small: every class about as likely, a loss of about log(10).
  CHECK(losses[0] == doctest::Approx(std::log(10.0)).epsilon(0.05));
  CHECK(losses.back() < 0.75 * std::log(10.0));  // it learns
  CHECK(one.evaluate(data().test).member_accuracy[0] > 0.3);  // well above chance (0.1) on unseen images

  // 2 members on 2 devices, the losses read after every step and after steps 3, 6, 9 and 10: on_step sees every
  // step, in order, with the same numbers, and the training is the same.
  using Report = std::tuple<int, int, double, double, double>;  // step, steps, loss, running loss and accuracy
  auto run = [&](int report_every, std::vector<Report>& reports) {
    train::Trainer t(cnn, sgd(), cpu_mesh(2), {.members = 2, .batch_size = 64, .report_every = report_every});
    const train::EpochReport e = t.run_epoch(data().train, [&](const train::StepReport& r) {
      reports.emplace_back(r.step, r.steps, r.loss, r.running_loss, r.running_accuracy);
    });
    return std::pair{e, stacked(t.params(), cnn.param_names())};
  };
  std::vector<Report> every, sparse;
  const auto [a, params_a] = run(1, every);
  const auto [b, params_b] = run(3, sparse);
  CHECK(every == sparse);
  REQUIRE(every.size() == 10);
  for (std::size_t i = 0; i < every.size(); ++i) {
    CHECK(std::get<0>(every[i]) == static_cast<int>(i) + 1);
    CHECK(std::get<1>(every[i]) == 10);
    CHECK((std::get<4>(every[i]) >= 0 && std::get<4>(every[i]) <= 1));
  }
  // The running numbers at the last step are the epoch's.
  CHECK(std::get<3>(every.back()) == doctest::Approx(a.train_loss).epsilon(1e-12));
  CHECK(std::get<4>(every.back()) == doctest::Approx(a.train_accuracy).epsilon(1e-12));
  CHECK(a.train_loss == b.train_loss);
  CHECK(a.train_accuracy == b.train_accuracy);
  CHECK(params_a == params_b);
}

}  // namespace PMAPCC_TEST_FILE
