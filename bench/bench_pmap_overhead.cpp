// bench_pmap_overhead: what pmap itself costs on CPU devices. Per device count: the median (and 10th and
// 90th percentile) of an empty pmap call, and of a 4-byte psum inside one call; then the CPU time the
// process uses while it sits idle between calls, to show that the workers do not spin while idle. The
// machine's load average is printed before and after, beside the figures. Usage: --help.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include <pmap/pmap.h>

#include "machine.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr double kTargetPerDeviceUs = 5.0;  // an empty call, per device, on an idle machine

struct Options {
  std::vector<int> devices{1, 2, 4};
  int calls = 2000;
  int idle_ms = 300;
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Row {
  int devices = 0;
  double call_p10 = 0, call_med = 0, call_p90 = 0;  // microseconds
  double psum_med = 0;                              // microseconds
  double idle_cpu = 0;                              // CPU seconds per wall second while idle
};

Row measure(const Options& o, int devices) {
  Row row;
  row.devices = devices;
  pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, devices), "i");
  auto empty = pmap::pmap([] {}, mesh);
  for (int i = 0; i < 200; ++i) empty();  // warm-up: threads started, paths hot
  std::vector<double> us(static_cast<std::size_t>(o.calls));
  for (double& t : us) {
    const auto t0 = Clock::now();
    empty();
    t = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  row.call_p10 = percentile(us, 0.1);
  row.call_med = percentile(us, 0.5);
  row.call_p90 = percentile(us, 0.9);

  std::vector<std::vector<double>> psum_us(static_cast<std::size_t>(devices),
                                           std::vector<double>(static_cast<std::size_t>(o.calls)));
  pmap::pmap([&] {
    const auto r = static_cast<std::size_t>(pmap::axis_index("i"));
    pmap::Array x = pmap::Array::from_host(std::vector<float>{1.0f}, {1}, pmap::current_device());
    for (int i = 0; i < 100; ++i) pmap::psum_inplace(x, "i");
    for (double& t : psum_us[r]) {
      const auto t0 = Clock::now();
      pmap::psum_inplace(x, "i");
      t = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    }
  }, mesh)();
  std::vector<double> slowest(static_cast<std::size_t>(o.calls), 0.0);
  for (const auto& d : psum_us)
    for (std::size_t i = 0; i < d.size(); ++i) slowest[i] = std::max(slowest[i], d[i]);
  row.psum_med = percentile(slowest, 0.5);

  empty();
  const double cpu0 = process_cpu_seconds();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(o.idle_ms));
  row.idle_cpu = (process_cpu_seconds() - cpu0) / std::chrono::duration<double>(Clock::now() - t0).count();
  return row;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--devices" && has_value) {
      o.devices = bench::parse_device_list(argv[0], argv[++i]);
    } else if (a == "--calls" && has_value) {
      o.calls = std::atoi(argv[++i]);
      if (o.calls < 10) {
        std::fprintf(stderr, "bench_pmap_overhead: --calls must be >= 10\n");
        std::exit(2);
      }
    } else {
      std::printf("usage: %s [--devices 1,2,4] [--calls 2000]\n", argv[0]);
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string command = bench::command_line(argc, argv);
  std::printf("machine: %s, %u hardware threads\n", bench::cpu_model().c_str(), std::thread::hardware_concurrency());
  std::printf("load average before: %s\n", bench::first_line("/proc/loadavg").c_str());
  std::printf("command: %s\n", command.c_str());
  std::printf("empty pmap call and a 4-byte psum_inplace inside one, on CPU devices; %d calls each; microseconds\n",
              o.calls);
  std::printf("idle_cpu: CPU seconds the process uses per second while idle after a call (workers asleep: ~0)\n\n");
  std::printf("%7s %10s %10s %10s %14s %10s %9s\n", "devices", "call_p10", "call_med", "call_p90",
              "call_med/dev", "psum_med", "idle_cpu");
  bool pass = true;
  for (int n : o.devices) {
    const Row r = measure(o, n);
    std::printf("%7d %10.2f %10.2f %10.2f %14.2f %10.2f %9.3f\n", r.devices, r.call_p10, r.call_med, r.call_p90,
                r.call_med / r.devices, r.psum_med, r.idle_cpu);
    std::fflush(stdout);
    if (n <= static_cast<int>(std::thread::hardware_concurrency()))
      pass = pass && r.call_med / r.devices <= kTargetPerDeviceUs && r.idle_cpu < 0.05;
  }
  std::printf("\nload average after: %s\n", bench::first_line("/proc/loadavg").c_str());
  std::printf("target: an empty call <= %.0f us per device (device counts up to the core count), idle_cpu < 0.05: %s\n",
              kTargetPerDeviceUs, pass ? "PASS" : "FAIL");
  return 0;
}
