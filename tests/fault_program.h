// Random programs of collectives with one injected fault, shared by the fault stress tests (one process:
// tests/test_fault_stress.cpp; several: tests/mpi/mpi_fault_stress.cpp). Every choice comes from a
// seeded generator, so that a printed seed replays a run.
#pragma once

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <pmap/pmap.h>

namespace fault_program {

enum class CollectiveKind { psum, pmean, pmax, all_gather, psum_scatter, barrier };
inline constexpr int kOpKinds = 6;
// The faults a device can inject: none, an exception, returning early from the function, a collective
// that differs from its peers' (op, shape, dtype), or sleeping past the collective timeout.
enum class FaultKind { none, exception, early_return, op_mismatch, shape_mismatch, dtype_mismatch, sleep };
inline constexpr int kFaultKinds = 7;

inline const char* fault_name(FaultKind f) {
  switch (f) {
    case FaultKind::none: return "none";
    case FaultKind::exception: return "exception";
    case FaultKind::early_return: return "early return";
    case FaultKind::op_mismatch: return "op mismatch";
    case FaultKind::shape_mismatch: return "shape mismatch";
    case FaultKind::dtype_mismatch: return "dtype mismatch";
    case FaultKind::sleep: return "sleep past the timeout";
  }
  return "?";
}

// "CollectiveMismatch", "Timeout", "Aborted", "ValueError" or "Error".
inline const char* error_kind(const pmap::Error& e) {
  if (dynamic_cast<const pmap::CollectiveMismatch*>(&e)) return "CollectiveMismatch";
  if (dynamic_cast<const pmap::Timeout*>(&e)) return "Timeout";
  if (dynamic_cast<const pmap::Aborted*>(&e)) return "Aborted";
  if (dynamic_cast<const pmap::ValueError*>(&e)) return "ValueError";
  return "Error";
}

struct Op {
  CollectiveKind kind;
  pmap::AxisNames axes;
  int length;  // elements per device (psum_scatter: per device of the group)
};

struct Fault {
  FaultKind kind = FaultKind::none;
  int device = 0;    // the faulty device's index along every axis
  int position = 0;  // the collective of the program before which it strikes
};

// Threads of this process (Linux: /proc/self/task), for checks that meshes leave none behind.
inline int thread_count() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir))
      if (e->d_name[0] != '.') ++n;
    closedir(dir);
  }
  return n;
}

// A joined thread can stay listed in /proc/self/task for a moment (the kernel wakes the joiner before it
// removes the task), so a count is read until it reaches `expected` or `patience` runs out; a leaked thread
// keeps the count above `expected` for good.
inline int settled_thread_count(int expected, std::chrono::milliseconds patience = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  int n = thread_count();
  while (n != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = thread_count();
  }
  return n;
}

// The process's own threads (main and any runtime helpers) without threads that are still exiting: the
// fewest seen over `window`.
inline int baseline_thread_count(std::chrono::milliseconds window = std::chrono::milliseconds(200)) {
  const auto deadline = std::chrono::steady_clock::now() + window;
  int fewest = thread_count();
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    fewest = std::min(fewest, thread_count());
  }
  return fewest;
}

// A uniform integer in [0, n).
inline int pick(std::mt19937& rng, int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); }

// 1 to 5 random collectives over random axes of `axis_choices`, then a barrier over its last entry
// (which must name every axis, so that every device meets every other before the call ends).
inline std::vector<Op> random_program(std::mt19937& rng, const std::vector<pmap::AxisNames>& axis_choices) {
  std::vector<Op> program;
  const int length = 1 + pick(rng, 5);
  for (int i = 0, count = 1 + pick(rng, 5); i < count; ++i)
    program.push_back(Op{static_cast<CollectiveKind>(pick(rng, kOpKinds)),
                         axis_choices[static_cast<std::size_t>(pick(rng, static_cast<int>(axis_choices.size())))],
                         1 + pick(rng, length * 3)});
  program.push_back(Op{CollectiveKind::barrier, axis_choices.back(), 1});
  return program;
}

// One collective on this device, with values axis_index + 1, checked against what the group must
// produce. `variant` (a mismatch fault) makes it differ from its peers'. Returns whether it was right.
inline bool run_op(const Op& op, FaultKind variant) {
  const int g = pmap::axis_size(op.axes), r = pmap::axis_index(op.axes);
  const int length = variant == FaultKind::shape_mismatch ? op.length + 1 : op.length;
  CollectiveKind kind = op.kind;
  if (variant == FaultKind::op_mismatch)
    kind = kind == CollectiveKind::psum ? CollectiveKind::pmax : CollectiveKind::psum;
  if (kind == CollectiveKind::barrier && variant != FaultKind::none && variant != FaultKind::op_mismatch)
    kind = CollectiveKind::psum;  // a barrier has no shape or dtype to get wrong
  // A dtype its peers do not send: f64 for pmean (which takes floating dtypes only), i32 otherwise.
  const pmap::DType dtype = variant != FaultKind::dtype_mismatch ? pmap::DType::f32
                            : kind == CollectiveKind::pmean      ? pmap::DType::f64
                                                                 : pmap::DType::i32;
  auto filled = [&](int n, float v) {
    pmap::Array a({n}, dtype);
    for (int i = 0; i < n; ++i) {
      if (dtype == pmap::DType::f32) a.data<float>()[i] = v;
      else if (dtype == pmap::DType::f64) a.data<double>()[i] = v;
      else a.data<std::int32_t>()[i] = static_cast<std::int32_t>(v);
    }
    return a;
  };
  auto all_equal = [](const std::vector<float>& v, float want) {
    for (float x : v)
      if (x != want) return false;
    return true;
  };
  const float tri = static_cast<float>(g * (g + 1) / 2);
  switch (kind) {
    case CollectiveKind::psum:
      return all_equal(pmap::psum(filled(length, r + 1.0f), op.axes).to_vector<float>(), tri);
    case CollectiveKind::pmean:
      return all_equal(pmap::pmean(filled(length, r + 1.0f), op.axes).to_vector<float>(), tri / g);
    case CollectiveKind::pmax:
      return all_equal(pmap::pmax(filled(length, r + 1.0f), op.axes).to_vector<float>(), static_cast<float>(g));
    case CollectiveKind::all_gather: {
      const auto v = pmap::all_gather(filled(length, r + 1.0f), op.axes).to_vector<float>();
      for (int k = 0; k < g; ++k)
        for (int i = 0; i < length; ++i)
          if (v[static_cast<std::size_t>(k * length + i)] != k + 1.0f) return false;
      return true;
    }
    case CollectiveKind::psum_scatter:
      return all_equal(pmap::psum_scatter(filled(g * length, r + 1.0f), op.axes, true).to_vector<float>(), tri);
    case CollectiveKind::barrier:
      pmap::barrier(op.axes);
      return true;
  }
  return false;
}

// Runs `program` on device `device` (its index along every axis), injecting `fault` where it strikes
// this device: throws ValueError, returns early, sleeps `sleep`, or runs a mismatched collective.
// Returns whether every result was right.
inline bool run_program(const std::vector<Op>& program, const Fault& fault, int device,
                        std::chrono::milliseconds sleep) {
  bool right = true;
  for (int p = 0; p < static_cast<int>(program.size()); ++p) {
    FaultKind variant = FaultKind::none;
    if (device == fault.device && p == fault.position) {
      switch (fault.kind) {
        case FaultKind::exception: throw pmap::ValueError("injected fault on device " + std::to_string(device));
        case FaultKind::early_return: return right;
        case FaultKind::sleep: std::this_thread::sleep_for(sleep); break;
        default: variant = fault.kind;
      }
    }
    right = run_op(program[static_cast<std::size_t>(p)], variant) && right;
  }
  return right;
}

}  // namespace fault_program
