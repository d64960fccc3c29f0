// bench_train_step: the training layer's traced step (train::TrainStep: module code, value_and_grad, the
// Optimizer, jit), bare and inside its loop (train::Trainer: the feed, the per-step numbers), against the
// runner's Trainer (ensemble::Trainer) on the same configuration, in one process, their epochs alternating
// round by round so that a change in the machine's speed falls on all three. Each round times one epoch of
// --steps training steps of each (the data order, keys and batch as the program's; the runner's epoch also
// evaluates on --batch test images, which its rate leaves out) and reports model-images/s, the ratios to the
// runner per round and their medians over the rounds after the first (the warm-up). One JSON line.
//   bench_train_step --data DIR [--model flax-cnn|keras-convnet] [--members M] [--devices D]
//                    [--mode ensemble|data-parallel] [--precision fp32|bf16] [--steps S] [--rounds R]
//                    [--batch B] (default: the model's recipe) [--member-batch N] (the traced step's members per
//                    vmap: StepOptions::member_batch, 0 its default)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <pmap/pmap.h>
#include <pmapcc/ensemble/trainer.h>
#include <pmapcc/io/json.h>
#include <pmapcc/kernels/cpu_backend.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/step.h>
#include <pmapcc/train/trainer.h>

#include "machine.h"

using namespace pmap;
using pmap::io::Json;

namespace {

using Clock = std::chrono::steady_clock;

std::map<std::string, std::string> parse(int argc, char** argv) {
  static const std::set<std::string> known{"data",  "model", "members", "devices",      "mode",
                                           "precision", "steps", "rounds", "batch", "member-batch"};
  std::map<std::string, std::string> f;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name.rfind("--", 0) != 0 || i + 1 >= argc) throw ValueError("expected --name value, got '" + name + "'");
    if (!known.count(name.substr(2))) throw ValueError("unknown flag '" + name + "' (see the top of the file)");
    f[name.substr(2)] = argv[++i];
  }
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto f = parse(argc, argv);
    auto get = [&](const char* n, const std::string& d) { return f.count(n) ? f.at(n) : d; };
    ensemble::TrainConfig c;
    c.model = get("model", "flax-cnn");
    const auto recipe = ensemble::model_recipe(c.model);
    c.optimizer.name = recipe.optimizer;
    c.batch_size = std::stoi(get("batch", std::to_string(recipe.batch_size)));
    c.devices = std::stoi(get("devices", "1"));
    c.members = std::stoi(get("members", "1"));
    c.mode = ensemble::parse_mode(get("mode", "ensemble"));
    c.precision = kernels::parse_precision(get("precision", "fp32").c_str(), "--precision");
    c.epochs = 1 << 20;
    const int steps = std::stoi(get("steps", "10")), rounds = std::stoi(get("rounds", "5"));
    if (steps < 1 || rounds < 2) throw ValueError("--steps must be >= 1 and --rounds >= 2");
    const bool dp = c.mode == ensemble::Mode::data_parallel;
    const std::string dir = get("data", "data/mnist");
    const auto train =
        ensemble::load_mnist(dir, ensemble::Split::train, static_cast<std::int64_t>(steps) * c.batch_size);
    const auto test = ensemble::load_mnist(dir, ensemble::Split::test, c.batch_size);
    c.eval_batch = c.batch_size;
    ensemble::Trainer runner(c, train, test);

    // The traced step on its own mesh of as many CPU devices, the runner's keys and data order.
    const std::string axis = dp ? "data" : "ensemble";
    Mesh mesh(local_devices(DeviceKind::cpu, c.devices), axis);
    const train::Model model = train::model_by_name(c.model, {28, 28, 1}, 10);
    const train::Optimizer tx = recipe.optimizer == "sgd"
                                    ? train::Optimizer(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f})
                                    : train::Optimizer(optim::Adam{.learning_rate = 1e-3f});
    const train::TrainStep step(model, tx, train::softmax_cross_entropy_loss,
                                {.axis = axis, .data_parallel = dp, .member_batch = std::stoi(get("member-batch", "0")),
                                 .precision = c.precision});
    const auto root = split(key(0), 2);
    const auto keys = split(root[0], static_cast<std::uint32_t>(c.members));
    const int per_device = dp ? c.members : c.members / c.devices;
    auto states = pmap::pmap([&](int) {
      const std::size_t first = dp ? 0 : static_cast<std::size_t>(axis_index(axis) * per_device);
      return step.init(std::span(keys).subspan(first, static_cast<std::size_t>(per_device)), current_device());
    }, mesh)(0);
    auto run = pmap::pmap([&](train::TrainState& s, const Array& x, const Array& y) { return step(s, x, y); }, mesh,
                          axis);
    std::vector<float> images(static_cast<std::size_t>(c.batch_size) * 784);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(c.batch_size));
    auto traced_epoch = [&](int epoch) {
      const auto order =
          permutation(fold_in(root[1], static_cast<std::uint32_t>(epoch)), static_cast<std::uint32_t>(train.count));
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        ensemble::gather_batch(train,
                               std::span(order).subspan(static_cast<std::size_t>(s) * c.batch_size, c.batch_size),
                               images.data(), labels.data());
        Array x = Array::from_host(images, {c.batch_size, 28, 28, 1}), y = Array::from_host(labels, {c.batch_size});
        auto m = dp ? run(states, shard(x, mesh), shard(y, mesh)) : run(states, replicate(x, mesh), replicate(y, mesh));
        (void)m[0].loss.to_vector<float>();  // the runner reads its losses back every step on CPU devices too
      }
      return static_cast<double>(dp ? 1 : c.members) * c.batch_size * steps /
             std::chrono::duration<double>(Clock::now() - t0).count();
    };
    // The loop around the step: train::Trainer on the same devices, keys and data order.
    train::Trainer trainer(model, tx, Mesh(local_devices(DeviceKind::cpu, c.devices), axis),
                           {.members = c.members, .data_parallel = dp, .batch_size = c.batch_size,
                            .eval_batch = c.batch_size, .member_batch = step.options().member_batch,
                            .precision = c.precision});
    std::vector<double> old_rate, new_rate, loop_rate, ratio, loop_ratio;
    for (int r = 0; r < rounds; ++r) {
      old_rate.push_back(runner.run_epoch().model_images_per_second);
      new_rate.push_back(traced_epoch(r));
      loop_rate.push_back(trainer.run_epoch(train).images_per_second);
      if (r > 0) ratio.push_back(new_rate.back() / old_rate.back());
      if (r > 0) loop_ratio.push_back(loop_rate.back() / old_rate.back());
    }
    Json j = Json::object();
    j["kind"] = "train_step";
    j["machine"] = bench::cpu_model();
    j["command"] = bench::command_line(argc, argv);
    j["model"] = c.model, j["members"] = c.members, j["devices"] = c.devices, j["mode"] = ensemble::to_string(c.mode);
    j["precision"] = kernels::name(c.precision), j["batch"] = c.batch_size, j["steps"] = steps, j["rounds"] = rounds;
    j["isa"] = kernels::cpu::isa();
    j["member_batch"] = step.options().member_batch;
    j["runner_model_images_per_s"] = old_rate;
    j["traced_model_images_per_s"] = new_rate;
    j["median_runner"] = median(std::vector<double>(old_rate.begin() + 1, old_rate.end()));
    j["median_traced"] = median(std::vector<double>(new_rate.begin() + 1, new_rate.end()));
    j["trainer_model_images_per_s"] = loop_rate;
    j["median_trainer"] = median(std::vector<double>(loop_rate.begin() + 1, loop_rate.end()));
    j["ratios_traced_over_runner"] = ratio;
    j["median_ratio"] = median(ratio);
    j["ratios_trainer_over_runner"] = loop_ratio;
    j["median_trainer_ratio"] = median(loop_ratio);
    std::printf("%s\n", j.dump().c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_train_step: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_step: %s\n", e.what());
    return 2;
  }
  return 0;
}
