// What every benchmark prints first (the machine, its load, the command that ran), the device-count list
// flag they share, and the layer benchmarks' timing and random inputs.
#pragma once

#include <cstdio>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace bench {

// The first line of a text file ("" when it cannot be read): /proc/loadavg gives the load averages.
inline std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The CPU's model name from /proc/cpuinfo.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// argv joined by spaces.
inline std::string command_line(int argc, char** argv) {
  std::string command = argv[0];
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  return command;
}

// A --devices list ("2,4,8"), each count in [1, 256]; otherwise prints "<program>: --devices: bad list
// '<text>'" and exits with status 2.
inline std::vector<int> parse_device_list(const char* program, const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v < 1 || v > 256 || (*end != ',' && *end != '\0')) {
      std::fprintf(stderr, "%s: --devices: bad list '%s' (counts 1..256, comma-separated)\n", program, text);
      std::exit(2);
    }
    out.push_back(static_cast<int>(v));
    p = *end == ',' ? end + 1 : end;
  }
  if (out.empty()) {
    std::fprintf(stderr, "%s: --devices: empty list\n", program);
    std::exit(2);
  }
  return out;
}

// The median seconds of `reps` calls of fn, after one warm-up call.
inline double median_seconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Normal(0, 1) floats from one seeded stream: normals(n) gives the next n.
class Normals {
 public:
  explicit Normals(unsigned seed) : rng_(seed) {}
  std::vector<float> operator()(std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal_(rng_);
    return v;
  }

 private:
  std::mt19937 rng_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
};

}  // namespace bench
