// bench_train: training throughput of the Flax MNIST CNN ensemble on CPU devices, one configuration per
// process (so peak RSS is that configuration's), and the measurements bench/run_train_bench.py sets beside
// it: the fp32 GEMM rate of the same kernels and the model's FLOPs per image. Each mode prints one JSON line.
//   bench_train train --data DIR --members M --devices D [--mode ensemble|data-parallel] [--steps S]
//                     [--warmup W] [--batch B] [--isa generic|avx2|avx512] [--pin] [--member-group G]
//                     [--model flax-cnn|keras-convnet] (the model's recipe: optimizer, batch unless --batch)
//                     [--precision fp32|bf16] (of the conv and dense products)
//                     [--cpu-threads T] (threads per device for the CPU ops' products: cpu::set_threads;
//                     also in every mode below, default PMAPCC_CPU_THREADS or 1)
//   bench_train paired --data DIR [--members-a 1] [--members-b 8] [--group-a G] [--group-b G] [--rounds R]
//                      [--steps-a S] [--steps-b S] [--batch B] [--isa ...]
//   bench_train sgemm [--threads T] [--size N] [--reps R] [--isa ...]
//                     [--rows R --cols C --depth K] [--layout nn|tn|nt|tt] (any product instead of N^3; t: that
//                     operand is stored transposed, as the conv and dense backward passes read them)
//   bench_train flops
//   bench_train layers [--batch B] [--reps R] [--isa ...] [--precision fp32|bf16] (each conv and dense layer's
//                      ops of one member on one thread, timed alone: forward, and backward = dW, db and dX)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <sys/resource.h>

#include <pmapcc/io/json.h>
#include <pmapcc/kernels/cpu_backend.h>
#include <pmapcc/nn/summary.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/recipe.h"
#include "examples/mnist_ensemble/run_checks.h"
#include "examples/mnist_ensemble/run_parts.h"
#include "machine.h"

using namespace pmap;
using namespace pmap::ensemble;
using pmap::io::Json;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string mode;
  std::map<std::string, std::string> flags;  // --name value, or --name "1" for a bare switch

  std::string get(const std::string& name, const std::string& fallback) const {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
  int get_int(const std::string& name, int fallback) const { return std::stoi(get(name, std::to_string(fallback))); }
};

Args parse(int argc, char** argv) {
  Args a;
  a.mode = argc > 1 ? argv[1] : "";
  for (int i = 2; i < argc; ++i) {
    std::string name = argv[i];
    if (name.rfind("--", 0) != 0) throw ValueError("unexpected argument '" + name + "'");
    const bool has_value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
    a.flags[name.substr(2)] = has_value ? argv[++i] : "1";
  }
  return a;
}

// Peak resident set size of this process in bytes (VmHWM; getrusage where /proc is absent).
double peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;  // kB on Linux
}

// CPU seconds (user + system) this process has used so far, over all its threads.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

// Multiply-adds per image of one forward pass, counted per module from the model: a module with a kernel of
// shape (..., Cout) does product(kernel) MACs per output position, product(output) / Cout positions (one
// inference apply on one image, as train::Model::summary runs it, each nn/ module call recorded).
struct LayerFlops {
  std::string name;
  double forward = 0;   // FLOPs per image: 2 * MACs
  bool computes_dx = true;  // the first layer has no input gradient
};

struct ModelCount {
  std::vector<LayerFlops> layers;
  std::int64_t activation_floats = 0;  // per example: every module call's output (ops between them not counted)
  std::int64_t params = 0;             // one member's parameters
};

ModelCount count_model(const train::Model& model) {
  const auto [params, state] = model.init(key(0));
  std::map<const void*, std::pair<std::string, Shape>> kernels;  // by storage: the kernels' names and shapes
  ModelCount out;
  for (const auto& [name, a] : params) {
    out.params += a.size();
    if (name.ends_with("/kernel")) kernels[a.raw_data()] = {name.substr(0, name.size() - 7), a.shape()};
  }
  Shape shape{1};
  shape.insert(shape.end(), model.input_shape().begin(), model.input_shape().end());
  const Array x = Array::from_host(std::vector<float>(static_cast<std::size_t>(num_elements(shape))), shape);
  nn::ModuleRecorder recorder;
  model.apply(params, state, x, train::Call{});
  for (const nn::ModuleCall& call : recorder.calls()) {
    out.activation_floats += num_elements(call.output);
    for (const void* t : call.tensors) {
      const auto it = kernels.find(t);
      if (it == kernels.end()) continue;
      const Shape& k = it->second.second;
      const double positions = static_cast<double>(num_elements(call.output)) / static_cast<double>(k.back());
      const double flops = 2.0 * static_cast<double>(num_elements(k)) * positions;
      out.layers.push_back({it->second.first, flops, !out.layers.empty()});
    }
  }
  return out;
}

// Forward + backward FLOPs per image: forward, dW (same as forward) and dX (same, except the first layer).
double train_flops_per_image(const ModelCount& model) {
  double total = 0;
  for (const LayerFlops& l : model.layers) total += l.forward * (l.computes_dx ? 3 : 2);
  return total;
}

// The first `count` examples of `all`, as a dataset of their own.
Dataset head(const Dataset& all, std::int64_t count) {
  Dataset d = all;
  d.count = std::min(count, all.count);
  d.images.resize(static_cast<std::size_t>(d.count * d.image_size()));
  d.images.shrink_to_fit();
  d.labels.resize(static_cast<std::size_t>(d.count));
  d.labels.shrink_to_fit();
  return d;
}

void set_isa(const Args& a) {
  if (a.flags.count("isa")) kernels::cpu::set_isa(a.get("isa", "auto"));
  if (a.flags.count("cpu-threads")) kernels::cpu::set_threads(a.get_int("cpu-threads", 1));
}

// Trains warm-up + timed steps of one configuration on the first (warm-up + steps) batches of the real
// training set (all of which stays loaded, as in mnist_ensemble) and reports throughput and memory.
Json run_train(const Args& a) {
  set_isa(a);
  const int warmup = a.get_int("warmup", 3), steps = a.get_int("steps", 20);
  TrainConfig c;
  c.devices = a.get_int("devices", 1);
  c.members = a.get_int("members", 1);
  c.mode = parse_mode(a.get("mode", "ensemble"));
  c.model = a.get("model", "flax-cnn");
  const ModelRecipe recipe = model_recipe(c.model);  // the program's defaults for the model
  c.optimizer.name = recipe.optimizer;
  c.batch_size = a.get_int("batch", recipe.batch_size);
  c.eval_batch = 1000;
  c.epochs = 1;
  c.pin_threads = a.flags.count("pin") > 0;
  c.member_group = a.get_int("member-group", 0);
  c.precision = kernels::parse_precision(a.get("precision", "fp32").c_str(), "--precision");
  const std::string dir = a.get("data", "data/mnist");
  const Dataset train_all = load_mnist(dir, Split::train), test_all = load_mnist(dir, Split::test);
  const Dataset train = head(train_all, static_cast<std::int64_t>(warmup + steps) * c.batch_size);
  const Dataset test = head(test_all, 1000);
  // The Trainer the program makes from these flags (its recipe).
  Mesh mesh = build_mesh(c, MeshAxes::one_axis);
  const TrainConfig r = resolved_config(c, mesh, train, test);
  const train::Model model = recipe_model(r, train);
  train::Trainer trainer(model, recipe_optimizer(r.optimizer, r.members, steps_per_epoch(train.count, r.batch_size)),
                         std::move(mesh), recipe_options(r, r.members));
  Clock::time_point t_start = Clock::now(), t_end = t_start;
  double cpu_start = cpu_seconds(), cpu_end = cpu_start;
  const train::EpochReport report = trainer.run_epoch(train, [&](const train::StepReport& s) {
    const int step = s.step;
    if (step == warmup) t_start = Clock::now(), cpu_start = cpu_seconds();
    if (step == warmup + steps) t_end = Clock::now(), cpu_end = cpu_seconds();
  });
  const double seconds = std::chrono::duration<double>(t_end - t_start).count();
  const double images = static_cast<double>(r.members) * c.batch_size * steps;
  const ModelCount counted = count_model(model);
  const double dataset_bytes = static_cast<double>(train_all.images.size() + train_all.labels.size() +
                                                   test_all.images.size() + test_all.labels.size());
  const double per_member = 4.0 * (2.0 * static_cast<double>(counted.params) +
                                    static_cast<double>(counted.activation_floats * c.batch_size));
  Json j = Json::object();
  j["kind"] = "train";
  j["members"] = r.members;
  j["devices"] = trainer.mesh().size();
  j["mode"] = to_string(c.mode);
  j["model"] = c.model;
  j["isa"] = kernels::cpu::isa();
  j["cpu_threads"] = kernels::cpu::threads();
  j["precision"] = kernels::name(c.precision);
  j["pin_threads"] = c.pin_threads;
  j["member_group"] = c.member_group > 0 ? c.member_group : 1;  // the Trainer's default on CPU devices
  j["batch"] = c.batch_size;
  j["warmup_steps"] = warmup;
  j["timed_steps"] = steps;
  j["seconds"] = seconds;
  j["cpu_seconds"] = cpu_end - cpu_start;  // over all threads: seconds * devices when nothing else runs
  j["model_images_per_s"] = images / seconds;
  j["gflops"] = images * train_flops_per_image(counted) / seconds / 1e9;
  j["peak_rss_mb"] = peak_rss_bytes() / 1e6;
  j["dataset_mb"] = dataset_bytes / 1e6;
  j["per_member_mb"] = per_member / 1e6;
  j["budget_mb"] = (dataset_bytes + r.members * per_member + 200e6) / 1e6;
  j["final_train_loss"] = report.train_loss;
  return j;
}

// Two one-device configurations A and B (member count, member group) in one process, their epochs
// alternating (an epoch of A: steps-a steps; of B: steps-b steps, each a second or so), so that a change
// in the machine's speed falls on both alike; reports per round the ratio of B's model-images/s (members
// x images / seconds) to A's, and the median over the rounds after the first (the warm-up).
Json run_paired(const Args& a) {
  set_isa(a);
  const int rounds = a.get_int("rounds", 9), batch = a.get_int("batch", 128);
  const int member_counts[2] = {a.get_int("members-a", 1), a.get_int("members-b", 8)};
  const int step_counts[2] = {a.get_int("steps-a", 16), a.get_int("steps-b", 2)};
  for (int i = 0; i < 2; ++i) {
    const std::string side = i == 0 ? "a" : "b";
    if (member_counts[i] < 1)
      throw ValueError("--members-" + side + " must be >= 1, got " + std::to_string(member_counts[i]));
    if (step_counts[i] < 1) throw ValueError("--steps-" + side + " must be >= 1, got " + std::to_string(step_counts[i]));
  }
  if (rounds < 2) throw ValueError("--rounds must be >= 2 (the first is a warm-up), got " + std::to_string(rounds));
  if (batch < 1) throw ValueError("--batch must be >= 1, got " + std::to_string(batch));
  const std::string dir = a.get("data", "data/mnist");
  const Dataset train_all = load_mnist(dir, Split::train), test_all = load_mnist(dir, Split::test);
  const Dataset test = head(test_all, batch);
  struct Side {
    std::string name;
    std::unique_ptr<Dataset> train;
    std::unique_ptr<train::Trainer> trainer;
    int group = 0, steps = 0;
    std::vector<double> rate;  // model-images/s, per round
  };
  auto make = [&](const std::string& name, int members, int group, int steps) {
    TrainConfig c;
    c.devices = 1, c.members = members, c.member_group = group, c.batch_size = batch, c.eval_batch = batch;
    Side side{name, std::make_unique<Dataset>(head(train_all, static_cast<std::int64_t>(steps) * batch)), nullptr,
              group > 0 ? group : 1, steps, {}};
    Mesh mesh = build_mesh(c, MeshAxes::one_axis);
    const TrainConfig r = resolved_config(c, mesh, *side.train, test);
    side.trainer = std::make_unique<train::Trainer>(recipe_model(r, *side.train),
                                                    recipe_optimizer(r.optimizer, r.members, steps * rounds),
                                                    std::move(mesh), recipe_options(r, r.members));
    return side;
  };
  Side sides[2] = {make("a", member_counts[0], a.get_int("group-a", 0), step_counts[0]),
                   make("b", member_counts[1], a.get_int("group-b", 0), step_counts[1])};
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    for (Side& side : sides) {
      side.rate.push_back(side.trainer->run_epoch(*side.train).images_per_second);
    }
    if (r > 0) ratios.push_back(sides[1].rate.back() / sides[0].rate.back());
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  Json j = Json::object();
  j["kind"] = "paired";
  j["isa"] = kernels::cpu::isa();
  j["batch"] = batch;
  j["rounds"] = rounds;
  for (const Side& side : sides) {
    Json s = Json::object();
    s["members"] = side.trainer->options().members;
    s["member_group"] = side.group;
    s["steps_per_round"] = side.steps;
    s["model_images_per_s"] = side.rate;
    s["median_model_images_per_s"] =
        median(std::vector<double>(side.rate.begin() + (side.rate.size() > 1 ? 1 : 0), side.rate.end()));
    j[side.name] = std::move(s);
  }
  j["ratios_b_over_a"] = ratios;
  j["median_ratio_b_over_a"] = median(ratios);
  j["min_ratio"] = ratios.empty() ? 0.0 : *std::min_element(ratios.begin(), ratios.end());
  j["max_ratio"] = ratios.empty() ? 0.0 : *std::max_element(ratios.begin(), ratios.end());
  return j;
}

// GFLOP/s of `threads` concurrent single-threaded size^3 GEMMs through the kernels' matmul (each thread its
// own matrices and workspace, as each CPU device has): after one warm-up product each, every thread runs
// `reps` products; the rate is all their FLOPs over the wall time (sustained, like a training run), and
// best_gflops the fastest single round.
Json run_sgemm(const Args& a) {
  set_isa(a);
  const int threads = a.get_int("threads", 1), n = a.get_int("size", 1536), reps = a.get_int("reps", 12);
  kernels::MatmulParams p;
  p.rows = a.get_int("rows", n), p.cols = a.get_int("cols", n), p.depth = a.get_int("depth", n);
  const std::string layout = a.get("layout", "nn");
  if (layout.size() != 2 || layout.find_first_not_of("nt") != std::string::npos)
    throw ValueError("sgemm: --layout must be nn, tn, nt or tt (got '" + layout + "')");
  p.transpose_a = layout[0] == 't', p.transpose_b = layout[1] == 't';
  struct Work {
    std::vector<float> a, b, c;
    std::vector<unsigned char> ws;
    double best = 1e30;
  };
  std::vector<Work> work(static_cast<std::size_t>(threads));
  const auto elems = [](int x, int y) { return static_cast<std::size_t>(x) * static_cast<std::size_t>(y); };
  for (std::size_t t = 0; t < work.size(); ++t) {
    work[t].a.assign(elems(p.rows, p.depth), 0.5f + 0.01f * static_cast<float>(t));
    work[t].b.assign(elems(p.depth, p.cols), 0.25f);
    work[t].c.assign(elems(p.rows, p.cols), 0.0f);
    work[t].ws.resize(kernels::cpu_backend().matmul_workspace_bytes(p));
  }
  auto run = [&](Work& w, int count) {
    for (int r = 0; r < count; ++r) {
      const auto t0 = Clock::now();
      kernels::cpu_backend().matmul(p, w.a.data(), w.b.data(), w.c.data(), w.ws.data());
      w.best = std::min(w.best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
  };
  auto all = [&](int count) {
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < work.size(); ++t) pool.emplace_back(run, std::ref(work[t]), count);
    run(work[0], count);
    for (auto& th : pool) th.join();
  };
  all(1);
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();
  all(reps);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = cpu_seconds() - cpu0;
  const double flops = 2.0 * p.rows * p.cols * static_cast<double>(p.depth);
  double best_rate = 0;
  for (const Work& w : work) best_rate += flops / w.best;
  Json j = Json::object();
  j["kind"] = "sgemm";
  j["isa"] = kernels::cpu::isa();
  j["threads"] = threads;
  j["size"] = n;
  j["rows"] = p.rows;
  j["cols"] = p.cols;
  j["depth"] = p.depth;
  j["layout"] = layout;
  j["reps"] = reps;
  j["seconds"] = seconds;
  j["cpu_seconds"] = cpu;
  j["gflops"] = flops * reps * threads / seconds / 1e9;
  j["gflops_per_cpu_second"] = flops * reps * threads / cpu / 1e9;
  j["best_gflops"] = best_rate / 1e9;
  return j;
}

Json run_flops() {
  const ModelCount model = count_model(train::flax_cnn());
  Json layers = Json::array();
  for (const LayerFlops& l : model.layers) {
    Json e = Json::object();
    e["layer"] = l.name;
    e["forward_mflop"] = l.forward / 1e6;
    e["train_mflop"] = l.forward * (l.computes_dx ? 3 : 2) / 1e6;
    layers.push_back(std::move(e));
  }
  Json j = Json::object();
  j["kind"] = "flops";
  j["layers"] = std::move(layers);
  j["train_mflop_per_image"] = train_flops_per_image(model) / 1e6;
  j["activation_floats_per_example"] = model.activation_floats;
  j["params_per_member"] = model.params;
  return j;
}

// The product layers of the Flax CNN at batch B, one member, one thread, each op timed alone (median of R
// calls after one warm-up, inputs random, workspaces sized once): GFLOP/s of the forward (with its bias and
// fused ReLU) and of the backward (dW, db, and dX except for the first layer), as the roofline of the layers
// that a training step's GEMMs run.
Json run_layers(const Args& a) {
  set_isa(a);
  const int batch = a.get_int("batch", 128), reps = a.get_int("reps", 15);
  if (batch < 1) throw ValueError("--batch must be >= 1, got " + std::to_string(batch));
  if (reps < 1) throw ValueError("--reps must be >= 1, got " + std::to_string(reps));
  const kernels::Precision precision = kernels::parse_precision(a.get("precision", "fp32").c_str(), "--precision");
  const kernels::Backend& be = kernels::cpu_backend();
  bench::Normals randoms(1);
  const auto median_seconds = [&](const std::function<void()>& fn) { return bench::median_seconds(reps, fn); };
  // FLOPs and which layers compute dX: the model's own count (count_model, as the training rows use), in
  // the order of the shapes below.
  const std::vector<LayerFlops> counted = count_model(train::flax_cnn()).layers;
  if (counted.size() != 4) throw ValueError("bench_train layers: the Flax CNN has changed its product layers");
  Json layers = Json::array();
  std::size_t next = 0;
  const auto report = [&](const std::string& name, double fwd_s, double bwd_s) {
    const LayerFlops& l = counted[next++];
    const double forward_flops = l.forward * batch;
    Json e = Json::object();
    e["layer"] = name;
    e["forward_ms"] = fwd_s * 1e3;
    e["backward_ms"] = bwd_s * 1e3;
    e["forward_gflops"] = forward_flops / fwd_s / 1e9;
    e["backward_gflops"] = forward_flops * (l.computes_dx ? 2 : 1) / bwd_s / 1e9;
    layers.push_back(std::move(e));
  };
  for (const auto& [name, size, cin, cout] : {std::tuple<const char*, int, int, int>{"conv1", 28, 1, 32},
                                              std::tuple<const char*, int, int, int>{"conv2", 14, 32, 64}}) {
    kernels::Conv2dParams p;
    p.batch = batch, p.height = p.width = size, p.in_channels = cin, p.out_channels = cout, p.relu = true;
    p.precision = precision;
    const std::size_t xn = std::size_t(batch) * size * size * cin, yn = std::size_t(batch) * size * size * cout;
    const auto x = randoms(xn), w = randoms(std::size_t(9) * cin * cout), b = randoms(std::size_t(cout));
    const auto dy = randoms(yn);
    std::vector<float> y(yn), dx(xn), dw(w.size()), db(b.size());
    std::vector<unsigned char> ws(be.conv().conv2d_workspace_bytes(p));
    float* dx_or_none = counted[next].computes_dx ? dx.data() : nullptr;  // the first layer has no dX
    const double fwd = median_seconds([&] { be.conv().conv2d_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data()); });
    const double bwd = median_seconds([&] {
      be.conv().conv2d_backward(p, x.data(), w.data(), dy.data(), dx_or_none, dw.data(), db.data(), ws.data());
    });
    report(name, fwd, bwd);
  }
  for (const auto& [name, in, out, relu] : {std::tuple<const char*, int, int, bool>{"dense1", 3136, 256, true},
                                            std::tuple<const char*, int, int, bool>{"dense2", 256, 10, false}}) {
    kernels::DenseParams p;
    p.batch = batch, p.in_features = in, p.out_features = out, p.relu = relu, p.precision = precision;
    const auto x = randoms(std::size_t(batch) * in), w = randoms(std::size_t(in) * out), b = randoms(std::size_t(out));
    const auto dy = randoms(std::size_t(batch) * out);
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size()), db(b.size());
    std::vector<unsigned char> ws(be.dense().dense_workspace_bytes(p));
    const double fwd = median_seconds([&] { be.dense().dense_forward(p, x.data(), w.data(), b.data(), y.data(), ws.data()); });
    const double bwd = median_seconds([&] {
      be.dense().dense_backward(p, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), ws.data());
    });
    report(name, fwd, bwd);
  }
  Json j = Json::object();
  j["kind"] = "layers";
  j["isa"] = kernels::cpu::isa();
  j["precision"] = kernels::name(precision);
  j["batch"] = batch;
  j["reps"] = reps;
  j["layers"] = std::move(layers);
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    Json out;
    if (a.mode == "train") {
      out = run_train(a);
    } else if (a.mode == "paired") {
      out = run_paired(a);
    } else if (a.mode == "sgemm") {
      out = run_sgemm(a);
    } else if (a.mode == "flops") {
      out = run_flops();
    } else if (a.mode == "layers") {
      out = run_layers(a);
    } else {
      std::fprintf(stderr,
                   "usage: bench_train train|paired|sgemm|flops|layers [--flags] (see the top of bench/bench_train.cpp)\n");
      return 2;
    }
    std::printf("%s\n", pmap::io::dump_json(out).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: error: %s\n", e.what());
    return 1;
  }
}
