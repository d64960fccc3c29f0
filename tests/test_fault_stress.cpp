// Randomized collective faults: for a bounded time, random sequences of collectives on random 1-D and 2-D
// CPU meshes (1 to 8 devices), with a fault injected at a random point of some calls: an exception on one
// device, an early return, a mismatched op, shape or dtype, or a device that sleeps past the timeout.
// Invariants: no hang; every device of a failed call raises (except one that returned early); the error
// pmap rethrows names the faulty device and has the fault's type; the mesh works for the next call; no
// thread is left behind. Seeded: PMAPCC_STRESS_SEED reproduces a run (the seed is printed);
// PMAPCC_STRESS_SECONDS bounds it (default 4).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <pmap/pmap.h>

#include "fault_program.h"

namespace PMAPCC_TEST_FILE {  // this file's own names (tests/CMakeLists.txt: unity build)

namespace {

using Clock = std::chrono::steady_clock;
using namespace fault_program;

int seed_from_env() {
  if (const char* s = std::getenv("PMAPCC_STRESS_SEED")) return std::atoi(s);
  return static_cast<int>(std::random_device{}() & 0x7fffffff);
}

double seconds_from_env() {
  const char* s = std::getenv("PMAPCC_STRESS_SECONDS");
  return s != nullptr ? std::atof(s) : 4.0;
}

}  // namespace

TEST_CASE("randomized collective faults never hang, reach every device, name the faulty one, and leave the mesh usable") {
  const int seed = seed_from_env();
  const double budget = seconds_from_env();
  MESSAGE("fault stress: seed " << seed << " (PMAPCC_STRESS_SEED=" << seed << " reproduces it), " << budget << " s");
  std::mt19937 rng(static_cast<unsigned>(seed));
  { pmap::Mesh warm(pmap::local_devices(pmap::DeviceKind::cpu, 2), "w"); }  // runtimes' helper threads start
  const int threads_before = baseline_thread_count();
  const auto start = Clock::now();
  int calls = 0, faulted = 0, meshes = 0;
  std::vector<int> by_fault(kFaultKinds, 0);
  while (std::chrono::duration<double>(Clock::now() - start).count() < budget) {
    // A mesh: 1..8 devices, 1-D, or 2-D when the count factors.
    const int n = 1 + pick(rng, 8);
    const bool two_d = n % 2 == 0 && n > 2 && pick(rng, 2) == 0;
    pmap::MeshOptions options;
    options.collective_timeout = std::chrono::milliseconds(2000);  // short, but far above a loaded machine's stall
    const auto devices = pmap::local_devices(pmap::DeviceKind::cpu, n);
    pmap::Mesh mesh = two_d ? pmap::Mesh(devices, {{"a", 2}, {"b", n / 2}}, options) : pmap::Mesh(devices, "a", options);
    const auto axis_choices = two_d ? std::vector<pmap::AxisNames>{"a", "b", {"a", "b"}} : std::vector<pmap::AxisNames>{"a"};
    ++meshes;
    for (int call = 0; call < 6; ++call, ++calls) {
      CAPTURE(seed);
      CAPTURE(calls);
      const std::vector<Op> program = random_program(rng, axis_choices);
      Fault fault;
      if (n > 1 && pick(rng, 3) != 0) {
        fault.kind = static_cast<FaultKind>(1 + pick(rng, kFaultKinds - 1));
        if (faulted < kFaultKinds - 1) fault.kind = static_cast<FaultKind>(1 + faulted);  // every kind, at least once
        // A sleep costs the timeout: at most one per 10 s of the budget (and the first at once).
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        if (fault.kind == FaultKind::sleep && by_fault[static_cast<std::size_t>(FaultKind::sleep)] >= 1 + static_cast<int>(elapsed / 10))
          fault.kind = FaultKind::exception;
        fault.device = pick(rng, n);
        fault.position = pick(rng, static_cast<int>(program.size()));
      }
      const std::string fault_kind = fault_name(fault.kind);
      CAPTURE(fault_kind);
      CAPTURE(fault.device);
      CAPTURE(fault.position);
      std::vector<int> raised(static_cast<std::size_t>(n), 0), wrong(static_cast<std::size_t>(n), 0);
      std::string error, error_device;
      std::string error_type = "none";
      const auto t0 = Clock::now();
      try {
        pmap::pmap([&] {
          const int d = pmap::axis_index(axis_choices.back());
          try {
            if (!run_program(program, fault, d, std::chrono::milliseconds(2600))) wrong[static_cast<std::size_t>(d)] = 1;
          } catch (...) {
            raised[static_cast<std::size_t>(d)] = 1;
            throw;
          }
        }, mesh)();
      } catch (const pmap::Error& e) {
        error = e.what();
        error_device = e.device();
        error_type = error_kind(e);
      }
      CAPTURE(error);
      CHECK(Clock::now() - t0 < std::chrono::seconds(20));  // no hang (the timeout is 2 s)
      const std::string faulty = "cpu:" + std::to_string(fault.device);
      if (fault.kind == FaultKind::none) {
        CHECK(error_type == "none");
        CHECK(std::count(wrong.begin(), wrong.end(), 1) == 0);  // and every result was right
      } else {
        ++faulted;
        ++by_fault[static_cast<std::size_t>(fault.kind)];
        for (int d = 0; d < n; ++d)
          if (!(fault.kind == FaultKind::early_return && d == fault.device)) CHECK(raised[static_cast<std::size_t>(d)] == 1);
        CHECK(error.find(faulty) != std::string::npos);  // the error names the faulty device
        switch (fault.kind) {
          case FaultKind::exception:
            CHECK(error_type == "ValueError");
            CHECK(error_device == faulty);
            break;
          case FaultKind::sleep: CHECK(error_type == "Timeout"); break;
          default: CHECK(error_type == "CollectiveMismatch");
        }
      }
      // The mesh works for the next call.
      const auto ok = pmap::pmap([&] { return pmap::psum(1, axis_choices.back()); }, mesh)();
      CHECK(std::count(ok.begin(), ok.end(), n) == n);
    }
  }
  CHECK(settled_thread_count(threads_before) == threads_before);  // every mesh's threads are gone
  MESSAGE("fault stress: " << calls << " calls on " << meshes << " meshes, " << faulted << " with a fault (exception "
                           << by_fault[1] << ", early return " << by_fault[2] << ", op " << by_fault[3] << ", shape "
                           << by_fault[4] << ", dtype " << by_fault[5] << ", sleep " << by_fault[6] << ")");
  for (int k = 1; k < kFaultKinds; ++k) CHECK(by_fault[static_cast<std::size_t>(k)] > 0);
}

}  // namespace PMAPCC_TEST_FILE
