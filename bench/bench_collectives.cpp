// bench_collectives: psum latency and bandwidth on CPU devices (2, 4, 8 devices; 4 B .. 64 MiB), medians of
// repeated runs, beside a single-thread memcpy of the same bytes measured in the same run. Usage: --help.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <pmap/pmap.h>

#include "machine.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kTargetCount = 825'000;  // floats: the 3,300,000-byte row the issue target is about
constexpr int kTargetDevices = 2;
constexpr double kTargetRatio = 0.5;  // psum GB/s over memcpy GB/s

struct Options {
  std::vector<int> devices{2, 4, 8};
  std::size_t max_bytes = std::size_t{64} << 20;
  double seconds_per_row = 0.25;  // rough time budget of each measurement
  int min_reps = 7;
  int max_reps = 300;
};

struct Row {
  int devices = 0;
  std::size_t bytes = 0;
  double psum_s = 0;    // median seconds of one psum (slowest device of each repetition)
  double memcpy_s = 0;  // median seconds of one single-thread memcpy of `bytes`
  int reps = 0;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int reps_for(const Options& o, double one_run_s) {
  const double want = o.seconds_per_row / std::max(one_run_s, 1e-9);
  return std::clamp(static_cast<int>(want), o.min_reps, o.max_reps);
}

// Element counts (f32): powers of 4 from 1 element (4 B) up to max_bytes, plus the target row.
std::vector<std::size_t> counts_up_to(std::size_t max_bytes) {
  std::vector<std::size_t> counts;
  for (std::size_t c = 1; c * sizeof(float) <= max_bytes; c *= 4) counts.push_back(c);
  if (kTargetCount * sizeof(float) <= max_bytes) counts.push_back(kTargetCount);
  std::sort(counts.begin(), counts.end());
  return counts;
}

// Median seconds of a single-thread memcpy of `bytes` between two Arrays (64-byte aligned, as the psum's
// buffers are; glibc's memcpy is much slower on some machines for some relative misalignments).
double memcpy_seconds(const Options& o, std::size_t bytes) {
  const auto n = static_cast<std::int64_t>(bytes);
  pmap::Array src = pmap::Array::from_host(std::vector<std::uint8_t>(bytes, 1), {n});
  pmap::Array dst({n}, pmap::DType::u8);
  auto once = [&] {
    const auto t0 = Clock::now();
    std::memcpy(dst.raw_data(), src.raw_data(), bytes);
    asm volatile("" : : "r"(dst.raw_data()) : "memory");  // keep the copy: dst is never read
    return seconds_since(t0);
  };
  once();
  const int reps = reps_for(o, once());
  std::vector<double> t(static_cast<std::size_t>(reps));
  for (double& s : t) s = once();
  return median(t);
}

// Runs `reps` psums of `count` floats on every device, each started together after a barrier and timed on
// every device; a repetition's time is its slowest device's. In place, so nothing allocates while timing.
std::vector<double> psum_seconds(const pmap::Mesh& mesh, std::size_t count, int reps) {
  const auto n = static_cast<std::size_t>(mesh.size());
  std::vector<std::vector<double>> per_device(n, std::vector<double>(static_cast<std::size_t>(reps)));
  pmap::pmap([&] {
    const int r = pmap::axis_index("i");
    std::vector<float> mine(count, static_cast<float>(r + 1));
    pmap::Array x = pmap::Array::from_host(mine, {static_cast<std::int64_t>(count)}, pmap::current_device());
    pmap::psum_inplace(x, "i");  // warm-up: pages touched, caches and hub paths hot
    for (auto& t : per_device[static_cast<std::size_t>(r)]) {
      pmap::barrier("i");
      const auto t0 = Clock::now();
      pmap::psum_inplace(x, "i");
      t = seconds_since(t0);
    }
  }, mesh, "i")();
  std::vector<double> slowest(static_cast<std::size_t>(reps), 0.0);
  for (const auto& d : per_device)
    for (std::size_t k = 0; k < d.size(); ++k) slowest[k] = std::max(slowest[k], d[k]);
  return slowest;
}

Row measure(const Options& o, const pmap::Mesh& mesh, std::size_t count) {
  Row row;
  row.devices = mesh.size();
  row.bytes = count * sizeof(float);
  row.memcpy_s = memcpy_seconds(o, row.bytes);
  row.reps = reps_for(o, median(psum_seconds(mesh, count, 3)));
  row.psum_s = median(psum_seconds(mesh, count, row.reps));
  return row;
}

double gbps(std::size_t bytes, double s) { return static_cast<double>(bytes) / s / 1e9; }

void print_row(const Row& r) {
  const double ratio = r.memcpy_s / r.psum_s;  // = psum GB/s / memcpy GB/s
  std::printf("%7d %12zu %12.1f %10.3f %12.1f %12.3f %7.2f %6d%s\n", r.devices, r.bytes, r.psum_s * 1e6,
              gbps(r.bytes, r.psum_s), r.memcpy_s * 1e6, gbps(r.bytes, r.memcpy_s), ratio, r.reps,
              r.devices == kTargetDevices && r.bytes == kTargetCount * sizeof(float) ? "  <- target" : "");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--devices" && has_value) {
      o.devices = bench::parse_device_list(argv[0], argv[++i]);
    } else if (a == "--max-mib" && has_value) {
      o.max_bytes = static_cast<std::size_t>(std::strtoull(argv[++i], nullptr, 10)) << 20;
    } else if (a == "--seconds-per-row" && has_value) {
      o.seconds_per_row = std::strtod(argv[++i], nullptr);
    } else {
      std::printf("usage: %s [--devices 2,4,8] [--max-mib 64] [--seconds-per-row 0.25]\n", argv[0]);
      std::exit(a == "--help" || a == "-h" ? 0 : 2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const std::string command = bench::command_line(argc, argv);
  std::printf("machine: %s, %u hardware threads, load average %s\n", bench::cpu_model().c_str(),
              std::thread::hardware_concurrency(), bench::first_line("/proc/loadavg").c_str());
  std::printf("command: %s\n", command.c_str());
  std::printf("psum_inplace of f32 on CPU devices; medians; GB/s = bytes / time; ratio = psum GB/s / memcpy GB/s\n\n");
  std::printf("%7s %12s %12s %10s %12s %12s %7s %6s\n", "devices", "bytes", "psum_us", "psum_GB/s", "memcpy_us",
              "memcpy_GB/s", "ratio", "reps");
  const Row* target = nullptr;
  std::vector<Row> rows;
  rows.reserve(o.devices.size() * 16);
  for (int n : o.devices) {
    pmap::Mesh mesh(pmap::local_devices(pmap::DeviceKind::cpu, n), "i");
    for (std::size_t count : counts_up_to(o.max_bytes)) {
      rows.push_back(measure(o, mesh, count));
      print_row(rows.back());
      std::fflush(stdout);
      if (n == kTargetDevices && count == kTargetCount) target = &rows.back();
    }
  }
  if (target != nullptr) {
    const double ratio = target->memcpy_s / target->psum_s;
    std::printf("\ntarget: psum of 3,300,000 bytes over 2 devices at >= %.0f%% of memcpy bandwidth: %.0f%% %s\n",
                kTargetRatio * 100, ratio * 100, ratio >= kTargetRatio ? "PASS" : "FAIL");
  }
  return 0;
}
