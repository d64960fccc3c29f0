// The training layer on the differentiable core (train/): the models as module code draw the program's
// initial variables (Model::init of the Trainer's member keys) under the names its checkpoints use, and the
// traced step (value_and_grad, the Optimizer, jit, map over a device's members) trains an ensemble's members
// bit for bit alike on any device count and in any vmap batch, a data-parallel model on two devices as on one
// up to the sums' order, a hyper-parameter ensemble's members each as its values given to all, and on (fake)
// GPUs as on CPU devices; and the errors of bad variables, optimizer states and options.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/model.h>
#include <pmapcc/train/optimizer.h>
#include <pmapcc/train/step.h>
#include <pmapcc/train/trainer.h>

#include "cuda_testing.h"
#include "synthetic.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace train = pmap::train;
using pmap::Array;

namespace {

const pmap::testing::TrainingData& data() { return pmap::testing::training_data(); }

struct Plain {  // a user's transformation that does not say whether it is element by element (only that part)
  static constexpr const char* kName = "plain";
  using State = std::tuple<>;
};

// Each tensor of `names` stacked over the devices' members, tensor after tensor: a checkpoint's layout, as
// Trainer::params() and model_state() give it.
// `devices` limits it to the first ones (data parallel: one replica).
std::vector<float> stacked(const pmap::Sharded<train::TrainState>& states, const std::vector<std::string>& names,
                           train::Variables train::TrainState::*role, std::size_t devices = 0) {
  std::vector<float> out;
  for (const std::string& n : names)
    for (std::size_t d = 0; d < (devices ? devices : states.size()); ++d) {
      const auto v = (states[d].*role).at(n).to_vector<float>();
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

struct Run {
  pmap::Sharded<train::TrainState> states;
  std::vector<double> losses;  // each step's loss, the mean over the members (data parallel: one model's)
  std::vector<std::int32_t> correct;  // each step's correct examples, summed over the members
};

// One epoch as Trainer::run_epoch draws it (seed 0: members from split(split(key(0), 2)[0], members), the
// order permutation(fold_in(split(key(0), 2)[1], 0))) on `devices` devices of `kind`.
// `hyper`: every member's values (a device's members take theirs; data parallel: all of them).
Run run_epoch(const train::TrainStep& step, int devices, int members, int batch,
              pmap::DeviceKind kind = pmap::DeviceKind::cpu, const train::MemberHyperparams& hyper = {}) {
  pmap::Mesh mesh(pmap::local_devices(kind, devices), step.options().axis);
  const auto root = pmap::split(pmap::key(0), 2);
  const auto keys = pmap::split(root[0], static_cast<std::uint32_t>(members));
  const bool dp = step.options().data_parallel;
  const int per_device = dp ? members : members / devices;
  Run r{pmap::pmap([&](int) {
          const auto first = dp ? 0 : static_cast<std::size_t>(pmap::axis_index(step.options().axis) * per_device);
          auto part = [&](const std::vector<float>& v) {
            return v.empty() ? v : std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(first),
                                                      v.begin() + static_cast<std::ptrdiff_t>(first) + per_device);
          };
          return step.init(std::span(keys).subspan(first, static_cast<std::size_t>(per_device)),
                           pmap::current_device(),
                           {part(hyper.learning_rate), part(hyper.weight_decay), part(hyper.dropout_rate)});
        }, mesh)(0), {}, {}};
  auto run = pmap::pmap([&](train::TrainState& s, const Array& x, const Array& y) { return step(s, x, y); }, mesh,
                        step.options().axis);
  const auto& train_set = data().train;
  const auto order = pmap::permutation(pmap::fold_in(root[1], 0), static_cast<std::uint32_t>(train_set.count));
  std::vector<float> images(static_cast<std::size_t>(batch) * 144);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::int64_t s = 0; s < train_set.count / batch; ++s) {
    train::gather_batch(train_set,
                        std::span(order).subspan(static_cast<std::size_t>(s * batch), static_cast<std::size_t>(batch)),
                        images.data(), labels.data());
    Array x = Array::from_host(images, {batch, 12, 12, 1}), y = Array::from_host(labels, {batch});
    auto metrics = dp ? run(r.states, pmap::shard(x, mesh), pmap::shard(y, mesh))
                      : run(r.states, pmap::replicate(x, mesh), pmap::replicate(y, mesh));
    double loss = 0;
    std::int32_t correct = 0;
    for (const train::StepMetrics& m : metrics) {
      for (float l : m.loss.to_vector<float>()) loss += l;
      for (std::int32_t c : m.correct.to_vector<std::int32_t>()) correct += c;
      if (dp) break;  // every replica holds the same
    }
    r.losses.push_back(loss / (dp ? 1 : members));
    r.correct.push_back(correct);
  }
  return r;
}

}  // namespace

TEST_CASE("train models: module code draws the program's initial variables under its names") {
  // The names the program's checkpoints have always used (the runner's files in tests/data/runner hold them),
  // in the models' order.
  const std::vector<std::string> flax_names{"Conv_0/kernel",  "Conv_0/bias",  "Conv_1/kernel",  "Conv_1/bias",
                                            "Dense_0/kernel", "Dense_0/bias", "Dense_1/kernel", "Dense_1/bias"};
  const std::vector<std::string> keras_names{"Conv_0/kernel",    "BatchNorm_0/beta", "Conv_1/kernel",
                                             "BatchNorm_1/beta", "large_k/kernel",   "large_k/bias",
                                             "BatchNorm_2/beta", "Dense_0/kernel",   "Dense_0/bias",
                                             "Dense_1/kernel",   "Dense_1/bias"};
  const std::vector<std::string> keras_state{"BatchNorm_0/moving_mean", "BatchNorm_0/moving_variance",
                                             "BatchNorm_1/moving_mean", "BatchNorm_1/moving_variance",
                                             "BatchNorm_2/moving_mean", "BatchNorm_2/moving_variance"};
  CHECK(train::flax_cnn({12, 12, 1}).param_names() == flax_names);
  CHECK(train::flax_cnn({12, 12, 1}).state_names().empty());
  CHECK(train::keras_convnet({12, 12, 1}).param_names() == keras_names);
  CHECK(train::keras_convnet({12, 12, 1}).state_names() == keras_state);
  for (const std::string name : {"flax-cnn", "keras-convnet"}) {
    CAPTURE(name);
    const train::Model m = train::model_by_name(name, {12, 12, 1}, 10);
    // Member g starts from Model::init(split(split(key(seed), 2)[0], members)[g]) (seed 0), whatever the devices.
    const auto keys = pmap::split(pmap::split(pmap::key(0), 2)[0], 3);
    std::vector<train::Variables> p(3), s(3);
    for (std::size_t k = 0; k < 3; ++k) std::tie(p[k], s[k]) = m.init(keys[k]);
    std::vector<float> flat, flat_state;
    for (const std::string& n : m.param_names())
      for (const auto& v : p)
        for (float x : v.at(n).to_vector<float>()) flat.push_back(x);
    for (const std::string& n : m.state_names())
      for (const auto& v : s)
        for (float x : v.at(n).to_vector<float>()) flat_state.push_back(x);
    for (const int devices : {1, 3}) {
      CAPTURE(devices);
      const train::Trainer t(m, train::Optimizer(pmap::optim::Sgd{}),
                             pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "ensemble"),
                             {.members = 3});
      CHECK(pmap::testing::stacked(t.params(), m.param_names()) == flat);
      CHECK(pmap::testing::stacked(t.model_state(), m.state_names()) == flat_state);
    }
    CHECK(flat != std::vector<float>(flat.size(), flat[0]));  // drawn, not constant
    // BatchNorm's moving statistics start at mean 0 and variance 1.
    for (const std::string& n : m.state_names()) {
      CAPTURE(n);
      const float start = n.ends_with("moving_variance") ? 1.0f : 0.0f;
      for (float x : s[1].at(n).to_vector<float>()) CHECK(x == start);
    }
  }
  // Flax's biases start at zero.
  const train::Variables flax = train::flax_cnn({12, 12, 1}).init(pmap::key(2)).first;
  for (const char* bias : {"Conv_0/bias", "Dense_1/bias"})
    for (float x : flax.at(bias).to_vector<float>()) CHECK(x == 0.0f);
  // On MNIST's shape: Flax's 824,458 parameters; the convnet's 49,242 and 136 moving statistics.
  auto count = [](const train::Variables& v) {
    std::int64_t n = 0;
    for (const auto& [name, a] : v) n += a.size();
    return n;
  };
  CHECK(count(train::flax_cnn().init(pmap::key(1)).first) == 824458);
  const auto [kp, ks] = train::keras_convnet().init(pmap::key(1));
  CHECK(count(kp) == 49242);
  CHECK(count(ks) == 136);
  CHECK_THROWS_WITH_AS(train::model_by_name("resnet", {28, 28, 1}, 10, "--model"),
                       "--model must be one of flax-cnn, keras-convnet, got 'resnet'", pmap::ValueError);
  CHECK_THROWS_AS(train::flax_cnn({2, 2, 1}), pmap::ValueError);
}

TEST_CASE("train step: an ensemble's members train bit for bit alike on two devices and on one") {
  // flax-cnn, 4 members, SGD lr 0.1 momentum 0.9: one epoch of 10 steps, 2 members on each of 2 devices and
  // the 4 on one (each member from its own key, whatever the device that holds it).
  const train::TrainStep step(train::flax_cnn({12, 12, 1}),
                              train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}));
  const Run two = run_epoch(step, 2, 4, 64);
  const Run one = run_epoch(step, 1, 4, 64);
  const auto names = step.model().param_names();
  CHECK(stacked(two.states, names, &train::TrainState::params) ==
        stacked(one.states, names, &train::TrainState::params));
  REQUIRE(two.losses.size() == 10);
  CHECK(two.losses == one.losses);  // the members' losses summed in member order either way
  CHECK(two.correct == one.correct);
  const std::vector<std::int64_t> ten{10};
  for (const train::TrainState& s : two.states) CHECK(s.step.to_vector<std::int64_t>() == ten);
  CHECK(one.states[0].step.to_vector<std::int64_t>() == ten);
  // The counts are the examples' argmax: no member classifies more than the batch.
  for (std::int32_t c : two.correct) CHECK((c >= 0 && c <= 4 * 64));
}

TEST_CASE("train step: clipping by each member's global norm steps member by member, whatever the devices") {
  // chain(clip_by_global_norm, Sgd) is not element by element: each member keeps its own state and count, and
  // its norm is its own. Four members on one device against a member on each of four (where a device's norm
  // could only be its member's).
  const train::Optimizer tx(pmap::optim::chain(pmap::optim::clip_by_global_norm(0.5f),
                                               pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}));
  CHECK_FALSE(tx.elementwise());
  CHECK(train::Optimizer(pmap::optim::Sgd{}).elementwise());
  const train::TrainStep step(train::flax_cnn({12, 12, 1}), tx);
  const Run one = run_epoch(step, 1, 4, 64);
  const Run four = run_epoch(step, 4, 4, 64);
  const auto names = step.model().param_names();
  CHECK(stacked(one.states, names, &train::TrainState::params) ==
        stacked(four.states, names, &train::TrainState::params));
  CHECK(one.states[0].opt.at("1/count").shape() == pmap::Shape{4, 1});  // one count per member
  CHECK(four.states[3].opt.at("1/count").shape() == pmap::Shape{1, 1});
  // Without the clipping the run differs: the checks can fail.
  const train::TrainStep plain(train::flax_cnn({12, 12, 1}),
                               train::Optimizer(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}));
  const Run unclipped = run_epoch(plain, 1, 4, 64);
  CHECK(stacked(unclipped.states, names, &train::TrainState::params) !=
        stacked(one.states, names, &train::TrainState::params));
}

namespace {

// keras-convnet with Adam 1e-3 on the 12x12 data: an ensemble (the members on the mesh's "ensemble" axis) or
// one model data parallel (its batch split over "data").
train::TrainStep keras_step(bool dp) {
  const train::Optimizer adam(pmap::optim::Adam{.learning_rate = 1e-3f});
  return train::TrainStep(train::keras_convnet({12, 12, 1}), adam, train::softmax_cross_entropy_loss,
                          {.axis = dp ? "data" : "ensemble", .data_parallel = dp});
}

// The largest |difference| between two runs' tensors `names` of `role` (the first device's: a data-parallel
// replica), each tensor but `skip`.
float max_diff(const Run& a, const Run& b, const std::vector<std::string>& names,
               train::Variables train::TrainState::*role, const std::string& skip) {
  float out = 0;
  for (const std::string& n : names) {
    if (n == skip) continue;
    out = std::max(out, pmap::testing::max_abs_diff((a.states[0].*role).at(n).to_vector<float>(),
                                                    (b.states[0].*role).at(n).to_vector<float>()));
  }
  return out;
}

}  // namespace

// Under ThreadSanitizer (the stand-in's build, slow) the data-parallel case alone: its collectives are where
// threads meet.
#if defined(__SANITIZE_THREAD__)
const std::vector<bool> kModes{true};
#else
const std::vector<bool> kModes{true, false};
#endif

TEST_CASE("train step: BatchNorm, Dropout and Adam, data parallel and ensemble, on two devices as on one") {
  // An ensemble: two members on one device and one on each of two, bit for bit. Data parallel: the global
  // batch's step on two devices is one device's on the whole batch (BatchNorm's statistics over the global
  // batch, the dropout masks by global example index), up to the order of the sums.
  for (const bool dp : kModes) {
    CAPTURE(dp);
    const train::TrainStep step = keras_step(dp);
    const train::Model& m = step.model();
    const int members = dp ? 1 : 2;
    const Run two = run_epoch(step, 2, members, 64);
    const Run one = run_epoch(step, 1, members, 64);
    const std::size_t replicas = dp ? 1 : 0;
    const auto params = stacked(two.states, m.param_names(), &train::TrainState::params, replicas);
    const auto state = stacked(two.states, m.state_names(), &train::TrainState::state, replicas);
    const auto one_params = stacked(one.states, m.param_names(), &train::TrainState::params);
    const auto one_state = stacked(one.states, m.state_names(), &train::TrainState::state);
    MESSAGE("max |difference| between two devices and one after an epoch: params "
            << pmap::testing::max_abs_diff(params, one_params) << ", moving statistics "
            << pmap::testing::max_abs_diff(state, one_state));
    REQUIRE(two.losses.size() == 10);
    if (!dp) {
      CHECK(params == one_params);
      CHECK(state == one_state);
      CHECK(two.losses == one.losses);
      continue;
    }
    for (std::size_t i = 0; i < 10; ++i) CHECK(two.losses[i] == doctest::Approx(one.losses[i]).epsilon(1e-5));
    // large_k's bias feeds BatchNorm_2, which subtracts the batch's mean: its gradient is rounding noise, which
    // Adam scales to steps near its learning rate, in the directions of each run's noise (and BatchNorm_2's
    // moving mean takes them in). Every other tensor agrees.
    CHECK(max_diff(two, one, m.param_names(), &train::TrainState::params, "large_k/bias") <= 1e-5f);
    CHECK(max_diff(two, one, m.state_names(), &train::TrainState::state, "BatchNorm_2/moving_mean") <= 1e-5f);
    // The replicas are bitwise identical.
    for (const std::string& n : m.param_names())
      CHECK(two.states[1].params.at(n).to_vector<float>() == two.states[0].params.at(n).to_vector<float>());
  }
}

TEST_CASE("train step on GPUs: an ensemble and data parallel train on the GPUs as on CPU devices") {
  PMAPCC_REQUIRE_GPU();
  for (const bool dp : kModes) {
    CAPTURE(dp);
    const train::TrainStep step = keras_step(dp);
    const int members = dp ? 1 : 2;  // a member a GPU, or the one model over both
    const Run gpu = run_epoch(step, 2, members, 64, pmap::DeviceKind::cuda);
    const Run cpu = run_epoch(step, 2, members, 64, pmap::DeviceKind::cpu);
    const auto& names = step.model().param_names();
    const std::size_t replicas = dp ? 1 : 0;
    const float diff = pmap::testing::max_abs_diff(stacked(gpu.states, names, &train::TrainState::params, replicas),
                                                   stacked(cpu.states, names, &train::TrainState::params, replicas));
    MESSAGE("max |parameter difference| between the GPUs and CPU devices after an epoch: " << diff);
    // The products' sums run in another order than the CPU's (and Adam scales large_k's noise, above): the
    // losses agree.
    REQUIRE(gpu.losses.size() == 10);
    for (std::size_t i = 0; i < 10; ++i) CHECK(gpu.losses[i] == doctest::Approx(cpu.losses[i]).epsilon(1e-4));
    CHECK(gpu.states[0].step.to_vector<std::int64_t>() == std::vector<std::int64_t>{10});
    if (dp) {  // the replicas on the GPUs are bitwise identical
      for (const std::string& n : names)
        CHECK(gpu.states[1].params.at(n).to_vector<float>() == gpu.states[0].params.at(n).to_vector<float>());
    }
  }
}

TEST_CASE("train step: the state keeps its shapes (one trace a device), and members run in any vmap batch") {
  // An element-by-element optimizer (one state for the stacked members) and one that is not (a state each):
  // after init and after an epoch the state's tensors have the same shapes, and the jit traced once a device.
  const train::Optimizer sgd(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f});
  const train::Optimizer clipped(pmap::optim::chain(pmap::optim::clip_by_global_norm(0.5f),
                                                    pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}));
  for (const train::Optimizer* tx : {&sgd, &clipped}) {
    CAPTURE(tx->name());
    const train::TrainStep step(train::flax_cnn({12, 12, 1}), *tx);
    const std::vector<pmap::Key> keys = pmap::split(pmap::key(5), 3);
    const train::TrainState fresh = step.init(keys, pmap::Device{});
    const Run run = run_epoch(step, 2, 4, 64);
    for (const auto& entry : run.states[0].opt) {  // (not a structured binding: clang's CAPTURE cannot take one)
      const std::string& name = entry.first;
      const Array& a = entry.second;
      CAPTURE(name);
      CHECK(fresh.opt.at(name).shape().size() == a.shape().size());  // (3, ...) there, (2, ...) here
      CHECK(std::equal(a.shape().begin() + 1, a.shape().end(), fresh.opt.at(name).shape().begin() + 1));
    }
    const pmap::JitStats st = step.stats();
    CHECK(st.traces == 2);  // one per device
    CHECK(st.retraces == 0);
    CHECK(st.replays == 18);
  }
  // Members vmapped two at a time on a CPU device (the GPU's way): the same bits as one at a time.
  const train::TrainStep singles(train::flax_cnn({12, 12, 1}), sgd);
  const train::TrainStep pairs(train::flax_cnn({12, 12, 1}), sgd, train::softmax_cross_entropy_loss,
                               {.member_batch = 2});
  const auto names = singles.model().param_names();
  const Run run = run_epoch(pairs, 2, 4, 64);
  CHECK(stacked(run.states, names, &train::TrainState::params) ==
        stacked(run_epoch(singles, 2, 4, 64).states, names, &train::TrainState::params));
  // Three devices, one member each: the same three members as on one device.
  const Run run3 = run_epoch(singles, 3, 3, 64);
  CHECK(stacked(run3.states, names, &train::TrainState::params) ==
        stacked(run_epoch(singles, 1, 3, 64).states, names, &train::TrainState::params));
}

namespace {

// Member m's parameters (each tensor's slice, in the model's order) after a run.
std::vector<float> member_params(const Run& run, const train::Model& model, int members, int m) {
  const int per_device = members / static_cast<int>(run.states.size());
  const train::TrainState& s = run.states[static_cast<std::size_t>(m / per_device)];
  std::vector<float> out;
  for (const std::string& n : model.param_names()) {
    const Array& a = s.params.at(n);
    const auto v = a.to_vector<float>();
    const std::size_t each = v.size() / static_cast<std::size_t>(per_device), at = each * (m % per_device);
    out.insert(out.end(), v.begin() + static_cast<std::ptrdiff_t>(at),
               v.begin() + static_cast<std::ptrdiff_t>(at + each));
  }
  return out;
}

}  // namespace

TEST_CASE("train step: per-member learning rates and weight decays train each member as its values for all do") {
  const train::Model model = train::flax_cnn({12, 12, 1});
  namespace optim = pmap::optim;
  SUBCASE("Sgd (one fused pass over the stacked members): each member as a run of its rate for every member") {
    const std::vector<float> rates{0.1f, 0.03f, 0.2f, 0.05f};
    const train::TrainStep step(model, train::Optimizer(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}));
    const Run run = run_epoch(step, 2, 4, 64, pmap::DeviceKind::cpu, {.learning_rate = rates});
    CHECK(run.states[1].hyperparams.at("learning_rate").to_vector<float>() == std::vector<float>{0.2f, 0.05f});
    for (const int m : {1, 2}) {  // the first device's second member, the second device's first
      CAPTURE(m);
      const std::vector<float> alike(4, rates[static_cast<std::size_t>(m)]);
      CHECK(member_params(run, model, 4, m) ==
            member_params(run_epoch(step, 2, 4, 64, pmap::DeviceKind::cpu, {.learning_rate = alike}), model, 4, m));
    }
    // Every member at 0.1: members 1 to 3 differ (the check can fail), member 0 is the same.
    const Run same = run_epoch(step, 2, 4, 64);
    CHECK(member_params(same, model, 4, 0) == member_params(run, model, 4, 0));
    for (int m = 1; m < 4; ++m) CHECK(member_params(same, model, 4, m) != member_params(run, model, 4, m));
  }
  SUBCASE("AdamW under a warmup schedule (the ops, the values along the member axis), members two at a time") {
    // Two members on one device, vmapped together: each against a run of its values for both.
    auto adamw = [](float lr, float wd) {
      return train::Optimizer(optim::AdamW{.learning_rate = optim::constant_schedule(lr, 3), .weight_decay = wd});
    };
    const train::StepOptions pairs{.member_batch = 2};
    const train::TrainStep mixed(model, adamw(1e-3f, 0.004f), train::softmax_cross_entropy_loss, pairs);
    const Run run = run_epoch(mixed, 1, 2, 64, pmap::DeviceKind::cpu,
                              {.learning_rate = {1e-3f, 3e-3f}, .weight_decay = {0.0f, 0.05f}});
    const Run first = run_epoch(train::TrainStep(model, adamw(1e-3f, 0.0f), train::softmax_cross_entropy_loss, pairs),
                                1, 2, 64);
    const Run second = run_epoch(
        train::TrainStep(model, adamw(3e-3f, 0.05f), train::softmax_cross_entropy_loss, pairs), 1, 2, 64);
    CHECK(member_params(run, model, 2, 0) == member_params(first, model, 2, 0));
    CHECK(member_params(run, model, 2, 1) == member_params(second, model, 2, 1));
    CHECK(member_params(run, model, 2, 1) != member_params(first, model, 2, 1));
    CHECK(run.states[0].opt.at("count").shape() == pmap::Shape{1});  // one state for the stacked members
  }
  SUBCASE("dropout rates: keras-convnet's Dropout takes each member's, in any vmap batch") {
    const train::Model convnet = train::keras_convnet({12, 12, 1});
    const train::Optimizer adam(optim::Adam{.learning_rate = 1e-3f});
    const train::MemberHyperparams rates{.dropout_rate = {0.2f, 0.7f}};
    std::vector<Run> runs;
    for (const std::int64_t batch : {1, 2}) {  // one member a vmap, and both
      const train::TrainStep step(convnet, adam, train::softmax_cross_entropy_loss, {.member_batch = batch});
      runs.push_back(run_epoch(step, 1, 2, 64, pmap::DeviceKind::cpu, rates));
    }
    CHECK(stacked(runs[0].states, convnet.param_names(), &train::TrainState::params) ==
          stacked(runs[1].states, convnet.param_names(), &train::TrainState::params));
    // Each member as the model built with its rate for all; member 0 not as member 1's (the check can fail).
    const train::TrainStep mixed(convnet, adam);
    const Run& run = runs[0];
    const Run at_02 = run_epoch(train::TrainStep(train::keras_convnet({12, 12, 1}, 10, 0.2f), adam), 1, 2, 64);
    const Run at_07 = run_epoch(train::TrainStep(train::keras_convnet({12, 12, 1}, 10, 0.7f), adam), 1, 2, 64);
    CHECK(member_params(run, convnet, 2, 0) == member_params(at_02, convnet, 2, 0));
    CHECK(member_params(run, convnet, 2, 1) == member_params(at_07, convnet, 2, 1));
    CHECK(member_params(run, convnet, 2, 0) != member_params(at_07, convnet, 2, 0));
    CHECK_THROWS_WITH_AS(mixed.init(pmap::split(pmap::key(1), 2), pmap::Device{}, {.dropout_rate = {0.5f, 1.0f}}),
                         "TrainStep::init: hyperparams.dropout_rate[1] must be in [0, 1), got 1.000000",
                         pmap::ValueError);
    const train::TrainStep flax(model, adam);
    CHECK_THROWS_WITH_AS(flax.init(pmap::split(pmap::key(1), 2), pmap::Device{}, {.dropout_rate = {0.5f, 0.1f}}),
                         "TrainStep::init: hyperparams.dropout_rate: model 'flax-cnn' declares no Dropout layer "
                         "(Model's dropout_layers)",
                         pmap::ValueError);
  }
  SUBCASE("the errors: a list's length, a bad value, a hyper-parameter the optimizer does not take") {
    const train::TrainStep sgd(model, train::Optimizer(optim::Sgd{.learning_rate = 0.1f}));
    const auto keys = pmap::split(pmap::key(2), 3);
    CHECK_THROWS_WITH_AS(sgd.init(keys, pmap::Device{}, {.learning_rate = {0.1f, 0.2f}}),
                         "TrainStep::init: hyperparams.learning_rate has 2 values for 3 members; it needs one per "
                         "member (or none)",
                         pmap::ValueError);
    CHECK_THROWS_WITH_AS(sgd.init(keys, pmap::Device{}, {.learning_rate = {0.1f, -0.2f, 0.3f}}),
                         doctest::Contains("hyperparams.learning_rate[1] must be finite and >= 0"), pmap::ValueError);
    CHECK_THROWS_WITH_AS(sgd.init(keys, pmap::Device{}, {.learning_rate = {0.1f, 0.2f, std::nanf("")}}),
                         doctest::Contains("hyperparams.learning_rate[2] must be finite"), pmap::ValueError);
    CHECK_THROWS_WITH_AS(sgd.init(keys, pmap::Device{}, {.weight_decay = {0.1f, 0.2f, 0.3f}}),
                         "TrainStep::init: hyperparams.weight_decay: optim::Sgd has no per-member hyper-parameter "
                         "'weight_decay' (optim::Sgd and optim::Adam take it when their own weight_decay is not 0)",
                         pmap::ValueError);
    const train::Optimizer clip(optim::clip_by_global_norm(1.0f));
    CHECK_FALSE(clip.has_hyperparam("learning_rate"));
    CHECK(train::Optimizer(optim::AdamW{}).has_hyperparam("weight_decay"));
    CHECK(train::Optimizer(optim::RmsProp{}).has_hyperparam("learning_rate"));
    CHECK_FALSE(train::Optimizer(optim::Adam{}).has_hyperparam("weight_decay"));
    // An update given values it cannot take, or values that are not one per member of the leaves' axis.
    const train::Variables params = model.init(pmap::key(3)).first;  // one member: leading axes are the tensors'
    const train::Optimizer tx(optim::Sgd{.learning_rate = 0.1f});
    const train::Variables state = tx.init(params);
    train::Variables sgd_grads;
    for (const auto& [n, a] : params) sgd_grads.emplace(n, Array(a.shape(), pmap::DType::f32, a.device()));
    train::Variables bad;
    bad.emplace("momentum", Array::from_host(std::vector<float>{0.5f}, {1}));
    CHECK_THROWS_WITH_AS(tx.update(sgd_grads, state, params, bad),
                         "optim::Sgd has no per-member hyper-parameter 'momentum'", pmap::ValueError);
    train::Variables three;
    three.emplace("learning_rate", Array::from_host(std::vector<float>{0.1f, 0.2f, 0.3f}, {3}));
    // Three values against unstacked parameters: refused, even where a leaf's own leading axis is 3
    // (Conv_0/kernel (3, 3, 1, 32)).
    CHECK_THROWS_WITH_AS(tx.update(sgd_grads, state, params, three),
                         doctest::Contains("the per-member hyper-parameter 'learning_rate' has 3 values and "
                                           "parameter 'Conv_0/bias' is f32(32,)"),
                         pmap::ShapeError);
    train::Variables empty;
    empty.emplace("learning_rate", Array());
    CHECK_THROWS_WITH_AS(tx.update(sgd_grads, state, params, empty),
                         "optim::Sgd: the per-member hyper-parameter 'learning_rate' is empty", pmap::ValueError);
    // -0 is held as +0, as the one-value forms compute with it (so the bits agree).
    const auto held = sgd.init(keys, pmap::Device{}, {.learning_rate = {-0.0f, 0.1f, 0.0f}})
                          .hyperparams.at("learning_rate").to_vector<float>();
    CHECK_FALSE(std::signbit(held[0]));
    CHECK(held[1] == 0.1f);
  }
}

// On the (fake) GPUs: a GPU machine's run of the suite (scripts/gpu_checks.sh) and the cuda-standin build
// run it; CI's stand-in builds leave it out (under ASan and TSan about 20x its 25 s). SGD is compared with
// CPU devices. AdamW and keras-convnet's dropout rates (with Adam) are compared member by member with GPU runs
// that give every member one member's values: Adam divides by sqrt(nu), so a weight whose gradients are
// rounding noise (here 2,048 weights of member 1, lr 3e-3, decay 0.05) takes steps of about lr whose signs
// follow the noise, and the GPU's sums (in another order than the CPU's) end 2.7e-3 away after an epoch.
TEST_CASE("per-member values on GPUs: the learning rates and decays reach the CUDA kernels and the ops") {
  PMAPCC_REQUIRE_GPU();
  namespace optim = pmap::optim;
  const train::Model model = train::flax_cnn({12, 12, 1});
  const std::vector<float> rates{1e-3f, 3e-3f, 2e-3f, 1e-3f}, decays{0.0f, 0.05f, 0.01f, 0.004f};
  SUBCASE("Sgd with momentum: per-member rates, as on CPU devices") {
    const train::TrainStep step(model, train::Optimizer(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}));
    const Run gpu = run_epoch(step, 2, 4, 64, pmap::DeviceKind::cuda, {.learning_rate = rates});
    const Run cpu = run_epoch(step, 2, 4, 64, pmap::DeviceKind::cpu, {.learning_rate = rates});
    auto params = [&](const Run& r) { return stacked(r.states, model.param_names(), &train::TrainState::params); };
    const float diff = pmap::testing::max_abs_diff(params(gpu), params(cpu));
    MESSAGE("max |parameter difference| from the CPU devices after an epoch: " << diff);
    CHECK(diff <= 1e-5f);  // the products' sums may run in another order than the CPU's (values ignored: > 1e-3)
  }
  SUBCASE("AdamW: each member as a GPU run with its rate and decay for every member, bit for bit") {
    const train::TrainStep step(model, train::Optimizer(optim::AdamW{}));
    const train::MemberHyperparams hyper{.learning_rate = rates, .weight_decay = decays};
    const Run mixed = run_epoch(step, 2, 4, 64, pmap::DeviceKind::cuda, hyper);
    // Member 1 (on the first GPU) and members 2 and 3 (on the second) against runs of their values for all;
    // member 3 has member 0's rate, so its check fails if the decays do not reach the GPUs.
    for (const int m : {1, 2, 3}) {
      CAPTURE(m);
      const std::vector<float> rate(4, rates[static_cast<std::size_t>(m)]);
      const std::vector<float> decay(4, decays[static_cast<std::size_t>(m)]);
      const Run alike =
          run_epoch(step, 2, 4, 64, pmap::DeviceKind::cuda, {.learning_rate = rate, .weight_decay = decay});
      CHECK(member_params(mixed, model, 4, m) == member_params(alike, model, 4, m));
      for (int other = 0; other < 4; ++other) {  // the others' values differ: the check above can fail
        if (other != m) CHECK(member_params(mixed, model, 4, other) != member_params(alike, model, 4, other));
      }
    }
  }
  SUBCASE("dropout rates: keras-convnet's CUDA dropout kernel takes each member's, bit for bit") {
    // Members 1 (on the first GPU) and 2 (on the second) against runs of their rate for every member.
    const std::vector<float> dropout{0.1f, 0.5f, 0.3f, 0.7f};
    const train::TrainStep keras(train::keras_convnet({12, 12, 1}), train::Optimizer(optim::Adam{}));
    const train::Model& convnet = keras.model();
    const Run mixed = run_epoch(keras, 2, 4, 64, pmap::DeviceKind::cuda, {.dropout_rate = dropout});
    for (const int m : {1, 2}) {
      CAPTURE(m);
      const std::vector<float> rate(4, dropout[static_cast<std::size_t>(m)]);
      const Run alike = run_epoch(keras, 2, 4, 64, pmap::DeviceKind::cuda, {.dropout_rate = rate});
      CHECK(member_params(mixed, convnet, 4, m) == member_params(alike, convnet, 4, m));
      for (int other = 0; other < 4; ++other) {  // the others' rates differ: the check above can fail
        if (other != m) CHECK(member_params(mixed, convnet, 4, other) != member_params(alike, convnet, 4, other));
      }
    }
  }
}

// Out of the case above so that ThreadSanitizer runs it (each device's thread injects into its own copy).
TEST_CASE("train step: a chain's per-member values, member by member on two devices, and an ambiguous one") {
  namespace optim = pmap::optim;
  const train::Model model = train::flax_cnn({12, 12, 1});
  auto tx = [](float lr, float wd) {
    return train::Optimizer(optim::chain(optim::clip_by_global_norm(0.5f), optim::add_decayed_weights(wd),
                                         optim::Sgd{.learning_rate = lr, .momentum = 0.9f}));
  };
  const train::TrainStep mixed(model, tx(0.1f, 0.0f));
  CHECK(mixed.init(pmap::split(pmap::key(1), 2), pmap::Device{}, {.weight_decay = {0.f, 1e-3f}})
            .hyperparams.size() == 1);
  // Two members a device: each device's second member takes its own values (not the first's).
  const Run run = run_epoch(
      mixed, 2, 4, 64, pmap::DeviceKind::cpu,
      {.learning_rate = {0.1f, 0.05f, 0.1f, 0.05f}, .weight_decay = {0.0f, 1e-3f, 0.0f, 1e-3f}});
  const Run first = run_epoch(train::TrainStep(model, tx(0.1f, 0.0f)), 2, 4, 64);
  const Run second = run_epoch(train::TrainStep(model, tx(0.05f, 1e-3f)), 2, 4, 64);
  for (int m = 0; m < 4; ++m) {
    CAPTURE(m);
    CHECK(member_params(run, model, 4, m) == member_params(m % 2 ? second : first, model, 4, m));
    CHECK(member_params(run, model, 4, m) != member_params(m % 2 ? first : second, model, 4, m));
  }
  // A chain where two transformations take the weight decay: which one is meant is not clear.
  const train::Optimizer twice(optim::chain(optim::add_decayed_weights(0.0f), optim::AdamW{}));
  CHECK_THROWS_WITH_AS(twice.has_hyperparam("weight_decay"),
                       "optim::chain: 2 of its transformations take the per-member hyper-parameter 'weight_decay'; "
                       "give it to one of them only",
                       pmap::ValueError);
  CHECK(twice.has_hyperparam("learning_rate"));
}

TEST_CASE("train optimizer: state named for checkpoints, and the errors of bad variables, states and options") {
  const train::Variables params = train::flax_cnn({12, 12, 1}).init(pmap::key(3)).first;
  // Per-parameter slots by "<field>/<parameter>", the rest by path; inside a chain, the transformation's index.
  auto names = [](const train::Variables& v) {
    std::vector<std::string> out;
    for (const auto& [n, a] : v) out.push_back(n);
    return out;
  };
  const train::Optimizer sgd(pmap::optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f});
  const train::Variables sgd_state = sgd.init(params);
  CHECK(sgd_state.count("trace/Conv_0/kernel") == 1);
  CHECK(sgd_state.at("trace/Dense_1/bias").shape() == params.at("Dense_1/bias").shape());
  CHECK(sgd_state.count("count") == 1);
  CHECK(sgd_state.size() == params.size() + 1);
  const train::Optimizer chained(pmap::optim::chain(pmap::optim::clip_by_global_norm(1.0f), pmap::optim::Adam{}));
  const train::Variables adam_state = chained.init(params);
  CHECK(adam_state.count("1/mu/Conv_1/bias") == 1);
  CHECK(adam_state.count("1/nu/Dense_0/kernel") == 1);
  CHECK(adam_state.count("1/count") == 1);
  CHECK(adam_state.size() == 2 * params.size() + 1);
  // An update through the names is the typed update's, bit for bit.
  train::Variables grads;
  for (const auto& [n, a] : params) grads.emplace(n, pmap::ops::scale(a, 0.5f, 0.25f));
  const auto [updates, next] = sgd.update(grads, sgd_state, params);
  const pmap::optim::Sgd typed{.learning_rate = 0.1f, .momentum = 0.9f};
  const auto [typed_updates, typed_next] = typed.update(grads, typed.init(params), params);
  CHECK(names(updates) == names(params));
  for (const auto& [n, a] : updates) CHECK(a.to_vector<float>() == typed_updates.at(n).to_vector<float>());
  CHECK(next.at("count").to_vector<std::int64_t>() == std::vector<std::int64_t>{1});
  CHECK(names(next) == names(sgd_state));
  // Another optimizer's state, or a state missing a tensor, is refused naming the tensor.
  CHECK_THROWS_WITH_AS(sgd.update(grads, adam_state, params),
                       "optim::Sgd: the optimizer state has no tensor 'trace/Conv_0/bias'", pmap::ValueError);
  train::Variables extra = pmap::tree_copy(sgd_state);
  extra.emplace("trace/Conv_9/kernel", Array::from_host(std::vector<float>{1}, {1}));
  CHECK_THROWS_WITH_AS(sgd.update(grads, extra, params),
                       "optim::Sgd: the optimizer state has tensors this optimizer does not keep: "
                       "'trace/Conv_9/kernel'",
                       pmap::ValueError);
  // Variables a model does not have, or lacks, are refused naming them.
  const train::Model m = train::flax_cnn({12, 12, 1});
  const Array x = Array::from_host(std::vector<float>(2 * 144, 0.5f), {2, 12, 12, 1});
  train::Variables missing = pmap::tree_copy(params);
  missing.erase("Dense_0/bias");
  CHECK_THROWS_WITH_AS(m.apply(missing, {}, x, {}), "parameters: no tensor 'Dense_0/bias'", pmap::ValueError);
  train::Variables more = pmap::tree_copy(params);
  more.emplace("Dense_2/kernel", Array::from_host(std::vector<float>{1}, {1}));
  CHECK_THROWS_WITH_AS(m.apply(more, {}, x, {}), "parameters: unexpected tensors 'Dense_2/kernel'", pmap::ValueError);
  CHECK(m.apply(params, {}, x, {}).first.shape() == pmap::Shape{2, 10});
  // Bad options and models.
  CHECK_THROWS_WITH_AS(train::TrainStep(m, sgd, train::softmax_cross_entropy_loss, {.member_batch = -1}),
                       "TrainStep: options.member_batch must be >= 0, got -1", pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::TrainStep(m, sgd, train::Loss{}), "TrainStep: the loss is an empty function",
                       pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::TrainStep(m, sgd).init({}, pmap::Device{}), "TrainStep::init: no member keys",
                       pmap::ValueError);
  CHECK_THROWS_AS(train::Model("m", {28, 28}, 10, {"w"}, {}, {}, {}), pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::Model("m", {28, 28, 1}, 1, {"w"}, {}, {}, {}),
                       "Model 'm': classes must be >= 2, got 1", pmap::ValueError);
  CHECK_THROWS_WITH_AS(train::Model("m", {28, 28, 1}, 10, {}, {}, {}, {}), "Model 'm' has no parameters",
                       pmap::ValueError);
  // A batch the model cannot take, or labels that do not fit it.
  const train::TrainStep step(m, sgd);
  train::TrainState state = step.init(std::vector<pmap::Key>{pmap::key(1)}, pmap::Device{});
  const Array y = Array::from_host(std::vector<std::int32_t>{0, 1}, {2});
  CHECK_THROWS_WITH_AS(step(state, Array::from_host(std::vector<float>(2 * 784), {2, 28, 28, 1}), y),
                       "TrainStep: images are f32(2, 28, 28, 1); model 'flax-cnn' takes f32 (N, 12, 12, 1)",
                       pmap::ShapeError);
  CHECK_THROWS_WITH_AS(step(state, x, Array::from_host(std::vector<std::int32_t>{0}, {1})),
                       "TrainStep: labels are i32(1,); they must be i32 (2), one per image", pmap::ShapeError);
  // Rows that do not place the block in a global batch, and rows an ensemble does not take.
  CHECK_THROWS_WITH_AS(step(state, x, y, {1, 2}),
                       "TrainStep: rows {offset 1, total 2} for a block of 2 examples: an ensemble's members each see "
                       "the whole batch, {0, 2}",
                       pmap::ValueError);
  const train::TrainStep dp(m, sgd, train::softmax_cross_entropy_loss, {.axis = "data", .data_parallel = true});
  train::TrainState replica = dp.init(std::vector<pmap::Key>{pmap::key(1)}, pmap::Device{});
  for (const train::BatchRows rows : {train::BatchRows{4, 5}, train::BatchRows{0, 1}, train::BatchRows{-1, 7}}) {
    CAPTURE(rows.offset);
    CHECK_THROWS_WITH_AS(dp(replica, x, y, rows),
                         doctest::Contains("for a block of 2 examples: the block must lie within the global batch, "
                                           "0 <= offset <= total - 2"),
                         pmap::ValueError);
  }
  CHECK(replica.step.to_vector<std::int64_t>() == std::vector<std::int64_t>{0});  // no step was taken
  // A model whose init does not make the tensors it names.
  const train::Model wrong("wrong", {12, 12, 1}, 10, {"w"}, {}, [](pmap::Key, const pmap::Device&) {
    return std::pair{train::Variables{}, train::Variables{}};
  }, [](const train::Variables&, const train::Variables&, const Array& in, const train::Call&) {
    return std::pair{in.copy(), train::Variables{}};
  });
  CHECK_THROWS_WITH_AS(wrong.init(pmap::key(0)), "Model 'wrong': init made the parameters none, not w",
                       pmap::ValueError);
  // State names: only a vector as long as the parameters is named by them; two leaves of one name are refused.
  const std::vector<std::string> two{"a", "b"};
  CHECK(train::detail::state_names({"mu/0", "mu/1", "betas/0", "count", "0/1"}, two, "tx") ==
        std::vector<std::string>{"mu/a", "mu/b", "betas/0", "count", "0/1"});
  CHECK_THROWS_WITH_AS(train::detail::state_names({"mu/0", "mu/1", "mu/a"}, two, "tx"),
                       "tx: two leaves of its state are both named 'mu/a'", pmap::ValueError);
  // A transformation that does not say it is element by element is taken as not being one.
  CHECK_FALSE(pmap::optim::is_elementwise<Plain>());
  CHECK_FALSE(pmap::optim::Chain<Plain, pmap::optim::Sgd>::kElementwise);
  CHECK_FALSE(pmap::optim::chain(pmap::optim::clip_by_global_norm(1.0f), pmap::optim::Sgd{}).kElementwise);
  CHECK(pmap::optim::chain(pmap::optim::add_decayed_weights(0.1f), pmap::optim::Sgd{}).kElementwise);
  // argmax_hits: one count per leading index, and shapes that do not fit.
  const Array scores = Array::from_host(std::vector<float>{1, 0, 0, 1, 0, 1, 0, 1}, {2, 2, 2});
  const Array labels = Array::from_host(std::vector<std::int32_t>{0, 1}, {2});
  CHECK(pmap::ops::eager::argmax_hits(scores, labels).to_vector<std::int32_t>() == std::vector<std::int32_t>{2, 1});
  CHECK_THROWS_AS(pmap::ops::eager::argmax_hits(scores, Array::from_host(std::vector<std::int32_t>{0}, {1})),
                  pmap::ShapeError);
}

}  // namespace PMAPCC_TEST_FILE
