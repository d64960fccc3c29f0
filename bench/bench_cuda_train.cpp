// bench_cuda_train: training throughput of the Flax MNIST CNN on one GPU through the library's own path
// (train::Trainer as the program makes it from its flags: the feed, the jitted train step, CUDA graphs), in
// model-images/s (members x
// batch x steps / s) at batch 128: 1, 4 and 8 members batched on one device, the same replayed eagerly
// (no graphs), and one member per virtual device sharing the GPU (each its own stream). Each configuration
// trains one warm-up epoch (which captures the graphs) and then one timed epoch of --steps steps; the
// timing is the Trainer's epoch time (evaluation excluded). Prints the machine, a table and one JSON line
// per configuration. --precision fp32,bf16 runs every configuration in each precision (bf16: the conv and
// dense products on bf16 operands with fp32 sums, cuBLAS's GemmStridedBatchedEx). Exits 2 when no GPU is
// usable (it measures nothing then).
//   bench_cuda_train [--data DIR] [--steps N] [--report-every R] [--precision fp32|bf16|fp32,bf16]
// Without --data the images are random bytes (the speed does not depend on them).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <pmap/backends.h>

#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/recipe.h"
#include "examples/mnist_ensemble/run_checks.h"
#include "examples/mnist_ensemble/run_parts.h"

using namespace pmap;
using namespace pmap::ensemble;

namespace {

constexpr int kBatch = 128;

struct Options {
  std::string data;
  int steps = 200;
  int report_every = 0;
  std::vector<kernels::Precision> precisions{kernels::Precision::fp32};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw ValueError(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--data") {
      o.data = value;
    } else if (flag == "--steps") {
      o.steps = std::stoi(value);
    } else if (flag == "--report-every") {
      o.report_every = std::stoi(value);
    } else if (flag == "--precision") {
      o.precisions.clear();
      for (std::size_t at = 0; at <= value.size();) {
        const std::size_t comma = std::min(value.find(',', at), value.size());
        o.precisions.push_back(kernels::parse_precision(value.substr(at, comma - at).c_str(), "--precision"));
        at = comma + 1;
      }
    } else {
      throw ValueError("unknown flag '" + flag + "'");
    }
  }
  if (o.steps < 1) throw ValueError("--steps must be >= 1, got " + std::to_string(o.steps));
  return o;
}

// `count` random 28x28 images with labels 0..9 in turn.
Dataset random_dataset(std::int64_t count, std::uint32_t seed) {
  Dataset d;
  d.count = count, d.rows = 28, d.cols = 28;
  d.images.resize(static_cast<std::size_t>(count * 28 * 28));
  d.labels.resize(static_cast<std::size_t>(count));
  std::mt19937 gen(seed);
  for (auto& p : d.images) p = static_cast<std::uint8_t>(gen() & 0xff);
  for (std::int64_t i = 0; i < count; ++i) d.labels[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i % 10);
  return d;
}

struct Row {
  const char* mode;
  int members, devices;
  bool graphs;
};

void run(const Row& row, kernels::Precision precision, const Options& o, const Dataset& train, const Dataset& test) {
  TrainConfig c;
  c.backend = DeviceKind::cuda;
  c.devices = row.devices;
  c.members = row.members;
  c.batch_size = kBatch;
  c.epochs = 2;
  c.eval_batch = 1000;
  c.graphs = row.graphs;
  c.report_every = o.report_every;
  c.precision = precision;
  Mesh mesh = build_mesh(c, MeshAxes::one_axis);
  const TrainConfig r = resolved_config(c, mesh, train, test);
  const std::int64_t steps = steps_per_epoch(train.count, r.batch_size);
  train::Trainer trainer(recipe_model(r, train), recipe_optimizer(r.optimizer, r.members, r.epochs * steps),
                         std::move(mesh), recipe_options(r, r.members));
  trainer.run_epoch(train);                                   // warm-up: first steps eager, then capture
  const train::EpochReport m = trainer.run_epoch(train);     // timed
  const double ms_per_step = 1e3 * m.seconds / static_cast<double>(steps);
  const char* p = kernels::name(precision);
  std::printf("%-22s %s  members %2d  devices %2d  %8.3f ms/step  %12.0f model-images/s\n", row.mode, p, row.members,
              row.devices, ms_per_step, m.images_per_second);
  std::printf("{\"bench\": \"cuda_train\", \"mode\": \"%s\", \"precision\": \"%s\", \"members\": %d, \"devices\": %d, "
              "\"batch\": %d, \"steps\": %d, \"graphs\": %s, \"report_every\": %d, \"seconds\": %.6f, "
              "\"model_images_per_s\": %.1f}\n",
              row.mode, p, row.members, row.devices, kBatch, static_cast<int>(steps), row.graphs ? "true" : "false",
              r.report_every, m.seconds, m.images_per_second);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const GpuStatus gpu = cuda_status();
    if (gpu.count == 0) {
      std::fprintf(stderr, "bench_cuda_train: no usable GPU: %s\n",
                   gpu.problem.empty() ? "none found (no NVIDIA driver, no device or no CUDA build)" : gpu.problem.c_str());
      return 2;
    }
    const std::int64_t train_count = static_cast<std::int64_t>(o.steps) * kBatch;
    Dataset train, test;
    if (o.data.empty()) {
      train = random_dataset(train_count, 1), test = random_dataset(1000, 2);
    } else {
      train = load_mnist(o.data, Split::train, train_count), test = load_mnist(o.data, Split::test, 1000);
    }
    std::printf("bench_cuda_train: Flax MNIST CNN, batch %d, %d timed steps after a warm-up epoch, %s data; %d GPU(s)\n",
                kBatch, static_cast<int>(train.count / kBatch), o.data.empty() ? "random" : o.data.c_str(), gpu.count);
    const Row rows[] = {{"batched/graph", 1, 1, true},  {"batched/graph", 4, 1, true},  {"batched/graph", 8, 1, true},
                        {"batched/eager", 1, 1, false}, {"batched/eager", 8, 1, false}, {"virtual-devices/graph", 4, 4, true},
                        {"virtual-devices/graph", 8, 8, true}};
    for (const kernels::Precision p : o.precisions)
      for (const Row& r : rows) run(r, p, o, train, test);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_train: error: %s\n", e.what());
    return 1;
  }
}
