// bench_model_parallel: model parallelism's memory and speed on CPU devices. For each mesh shape DxM
// ("data" x "model"; Dx1 is data parallel, bit for bit) it trains the reference CNN (28x28, the Flax MNIST
// model) with the Megatron layout (Dense_0 column-parallel, Dense_1 row-parallel: 97 % of the weights split
// over "model") on a global batch through train::Trainer (options.sharding, SGD with momentum), in a child
// process of its own, and
// prints side by side: the floats each device holds for its weights (and so for gradients and momentum),
// the child's peak RSS, the median step time and images per second. Usage: --help.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <pmap/pmap.h>

#include <pmapcc/nn/parallel.h>
#include <pmapcc/optim/optim.h>
#include <pmapcc/train/trainer.h>

#include "machine.h"

namespace train = pmap::train;

namespace {

struct Options {
  std::vector<std::pair<int, int>> meshes{{1, 1}, {2, 1}, {1, 2}, {2, 2}, {1, 4}, {4, 1}};
  int batch = 128;
  int steps = 10;
};

[[noreturn]] void usage(int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: bench_model_parallel [--meshes 1x1,2x1,1x2,...] [--batch B] [--steps N]\n"
               "  Trains the reference CNN with Dense_0 column- and Dense_1 row-parallel over 'model' and the batch\n"
               "  split over 'data', one mesh shape per child process; prints per shape the weight floats per\n"
               "  device, peak RSS, median step time and images/s. Defaults: 1x1,2x1,1x2,2x2,1x4,4x1, batch 128,\n"
               "  10 timed steps (after 2 warm-up steps) of Trainer::run_epoch.\n");
  std::exit(status);
}

int positive(const char* flag, const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 1 || v > 100000) {
    std::fprintf(stderr, "bench_model_parallel: %s: '%s' is not a count in 1..100000\n", flag, text);
    std::exit(2);
  }
  return static_cast<int>(v);
}

std::vector<std::pair<int, int>> parse_meshes(const char* text) {
  std::vector<std::pair<int, int>> out;
  for (const char* p = text; *p != '\0';) {
    int d = 0, m = 0, used = 0;
    if (std::sscanf(p, "%dx%d%n", &d, &m, &used) != 2 || d < 1 || m < 1 || d * m > 64 ||
        (p[used] != ',' && p[used] != '\0')) {
      std::fprintf(stderr, "bench_model_parallel: --meshes: bad list '%s' (e.g. 1x1,2x2; at most 64 devices)\n", text);
      std::exit(2);
    }
    out.emplace_back(d, m);
    p += used + (p[used] == ',' ? 1 : 0);
  }
  if (out.empty()) usage(2);
  return out;
}


// Noise images and labels: the step's cost does not depend on what it learns.
train::Dataset noise(std::int64_t count, std::uint64_t seed) {
  train::Dataset d;
  d.count = count;
  d.rows = d.cols = 28;
  std::vector<std::uint32_t> bits(static_cast<std::size_t>(count * (d.image_size() + 1)));
  pmap::random_bits(pmap::key(seed), bits);
  const auto pixels = static_cast<std::size_t>(count * d.image_size());
  for (std::size_t i = 0; i < pixels; ++i) d.images.push_back(static_cast<std::uint8_t>(bits[i]));
  for (std::size_t i = pixels; i < bits.size(); ++i) d.labels.push_back(static_cast<std::uint8_t>(bits[i] % 10));
  return d;
}

// One mesh shape, in this process: the model-parallel trainer (Trainer::run_epoch: feeds, steps and the
// per-step log gathers) for steps + 2 steps; prints "local_floats median_seconds" of the last `steps`.
int run_one(int d_size, int m_size, int batch, int steps) {
  if (batch % d_size != 0) {
    std::fprintf(stderr, "bench_model_parallel: batch %d does not split over %d data devices\n", batch, d_size);
    return 2;
  }
  const train::Dataset data = noise(static_cast<std::int64_t>(batch) * (steps + 2), 1);
  train::TrainerOptions o{.data_parallel = true, .batch_size = batch};
  o.sharding.params.set("Dense_0/kernel", pmap::P(pmap::none, "model"));
  o.sharding.params.set("Dense_0/bias", pmap::P("model"));
  o.sharding.params.set("Dense_1/kernel", pmap::P("model", pmap::none));
  const train::Optimizer sgd(pmap::optim::Sgd{.learning_rate = 0.01f, .momentum = 0.9f});
  train::Trainer trainer(train::flax_cnn(), sgd,
                         pmap::Mesh(pmap::local_devices(pmap::DeviceKind::cpu, d_size * m_size),
                                    {{"data", d_size}, {"model", m_size}}),
                         o);
  long long local = 0;  // the floats of the first device's weights
  for (const auto& entry : trainer.states()[0].params) local += entry.second.size();
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> at{Clock::now()};
  trainer.run_epoch(data, [&](const train::StepReport&) { at.push_back(Clock::now()); });
  std::vector<double> seconds;
  for (std::size_t s = 3; s < at.size(); ++s)  // after 2 warm-up steps
    seconds.push_back(std::chrono::duration<double>(at[s] - at[s - 1]).count());
  std::sort(seconds.begin(), seconds.end());
  std::printf("%lld %.9f\n", local, seconds[seconds.size() / 2]);
  return 0;
}

struct Row {
  int d = 0, m = 0;
  long long local_floats = 0;
  double median = 0, peak_rss_mb = 0;
};

// Runs `self --one DxM ...` and reads its line; the child's peak RSS from wait4.
bool run_child(const char* self, const Options& o, Row& row) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    const std::string mesh = std::to_string(row.d) + "x" + std::to_string(row.m);
    const std::string batch = std::to_string(o.batch), steps = std::to_string(o.steps);
    execl(self, self, "--one", mesh.c_str(), "--batch", batch.c_str(), "--steps", steps.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  char buf[256] = {};
  std::size_t got = 0;
  for (ssize_t r; got + 1 < sizeof buf && (r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0;)
    got += static_cast<std::size_t>(r);
  close(fds[0]);
  int status = 0;
  rusage ru{};
  if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  row.peak_rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;  // KiB on Linux
  return std::sscanf(buf, "%lld %lf", &row.local_floats, &row.median) == 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const char* one = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(0);
    if (i + 1 >= argc) usage(2);
    if (a == "--meshes") {
      o.meshes = parse_meshes(argv[++i]);
    } else if (a == "--batch") {
      o.batch = positive("--batch", argv[++i]);
    } else if (a == "--steps") {
      o.steps = positive("--steps", argv[++i]);
    } else if (a == "--one") {
      one = argv[++i];
    } else {
      usage(2);
    }
  }
  try {
    if (one != nullptr) {
      const auto mesh = parse_meshes(one);
      return run_one(mesh[0].first, mesh[0].second, o.batch, o.steps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model_parallel: error: %s\n", e.what());
    return 1;
  }
  for (const auto& [d, m] : o.meshes)
    if (o.batch % d != 0) {
      std::fprintf(stderr, "bench_model_parallel: --batch %d does not split over the %d data devices of %dx%d\n",
                   o.batch, d, d, m);
      return 2;
    }
  std::printf("machine: %s, %u cores; load before: %s\ncommand: %s\n", bench::cpu_model().c_str(),
              std::thread::hardware_concurrency(), bench::first_line("/proc/loadavg").c_str(),
              bench::command_line(argc, argv).c_str());
  std::printf("reference CNN (824,458 weights), Megatron layout, global batch %d, median of %d steps\n\n", o.batch,
              o.steps);
  // w+g+m: the bytes of a device's weights, gradients and momentum (f32 each).
  std::printf("%-6s %8s %16s %14s %12s %14s %12s %12s\n", "mesh", "devices", "weights/device", "of one model",
              "w+g+m MB", "peak RSS MB", "step ms", "images/s");
  for (const auto& [d, m] : o.meshes) {
    Row row{d, m};
    if (!run_child(argv[0], o, row)) {
      std::fprintf(stderr, "bench_model_parallel: the %dx%d run failed\n", d, m);
      return 1;
    }
    std::printf("%dx%-4d %8d %16lld %13.1f%% %12.2f %14.1f %12.2f %12.0f\n", d, m, d * m, row.local_floats,
                100.0 * static_cast<double>(row.local_floats) / 824458.0,
                12.0 * static_cast<double>(row.local_floats) / 1e6, row.peak_rss_mb, row.median * 1e3,
                o.batch / row.median);
  }
  std::printf("\nload after: %s\n", bench::first_line("/proc/loadavg").c_str());
  return 0;
}
