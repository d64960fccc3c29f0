// `pmapcc_mpi_tests fault-stress SEED`: one randomized fault over processes. From SEED (the same on every
// rank) it draws 1 to 3 CPU devices per process, a 1-D or 2-D mesh over all of them, 1 to 4 calls of
// random collectives (tests/fault_program.h) and, in three runs of four, a fault on one device in one
// call. Every rank checks:
//   - the calls before the fault (all of them without one) succeed with the right results;
//   - in the faulted call this process raises, its error naming the faulty device or its process (the
//     faulty process itself may finish that call only when its one device returned early: nobody was
//     left in it to notice);
//   - the job cannot go on: the next call raises on every process (Aborted: "exit and restart the job"),
//     at the latest after its own process timeout; without a fault the next call succeeds.
// It prints one "VERDICT rank R: ok" or "VERDICT rank R: FAILED: ..." line and returns 0 only on ok.
// tests/mpi/run_fault_stress.sh runs it with many seeds for a bounded time.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <pmap/pmap.h>

#include "mpi_test_support.h"

namespace {

using namespace fault_program;

struct Outcome {
  bool raised = false;
  std::string kind, message;
  bool right = true;  // every result of the call was right (on this process's devices)
};

// One call of `program` over the mesh, with `fault` (none: FaultKind::none).
Outcome run_call(pmap::Mesh& mesh, const std::vector<Op>& program, const Fault& fault,
                 const pmap::AxisNames& all, std::chrono::milliseconds sleep) {
  Outcome out;
  try {
    const auto right = pmap::pmap([&] { return run_program(program, fault, pmap::axis_index(all), sleep) ? 1 : 0; },
                                  mesh)();
    for (int r : right) out.right = out.right && r == 1;
  } catch (const pmap::Error& e) {
    out = Outcome{true, error_kind(e), e.what(), true};
  }
  return out;
}

// After a fault MPI stays unfinalized (the processes are out of step), and mpirun ends the whole job
// when the first process exits so: the verdicts go to files in $PMAPCC_STRESS_DIR too, and every process
// waits (at most 30 s) until all are there before exiting.
void wait_for_verdicts(int rank, int procs, const std::string& verdict) {
  const char* dir = std::getenv("PMAPCC_STRESS_DIR");
  if (dir == nullptr) return;
  const std::string base = std::string(dir) + "/verdict.";
  if (std::FILE* f = std::fopen((base + std::to_string(rank) + ".tmp").c_str(), "w")) {
    std::fprintf(f, "VERDICT rank %d: %s\n", rank, verdict.c_str());
    std::fclose(f);
    std::rename((base + std::to_string(rank) + ".tmp").c_str(), (base + std::to_string(rank)).c_str());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int q = 0; q < procs && std::chrono::steady_clock::now() < deadline;) {
    if (std::FILE* f = std::fopen((base + std::to_string(q)).c_str(), "r")) {
      std::fclose(f);
      ++q;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace

int run_fault_stress(unsigned seed) {
  const int rank = pmap::distributed::process_index(), procs = pmap::distributed::process_count();
  std::mt19937 rng(seed);
  const int local_n = 1 + pick(rng, 3), n = procs * local_n;
  std::vector<int> factors;
  for (int a = 2; a < n; ++a)
    if (n % a == 0) factors.push_back(a);
  std::vector<pmap::AxisSpec> axes{{"a", n}};
  std::vector<pmap::AxisNames> axis_choices{"a"};
  if (!factors.empty() && pick(rng, 2) == 0) {
    const int a = factors[static_cast<std::size_t>(pick(rng, static_cast<int>(factors.size())))];
    axes = {{"a", a}, {"b", n / a}};
    axis_choices = {"a", "b", pmap::AxisNames{"a", "b"}};
  }
  std::vector<std::vector<Op>> calls;
  for (int c = 0, count = 1 + pick(rng, 4); c < count; ++c) calls.push_back(random_program(rng, axis_choices));
  const int fault_call = pick(rng, static_cast<int>(calls.size()));
  Fault fault;
  if (pick(rng, 4) != 0) {
    fault.kind = static_cast<FaultKind>(1 + pick(rng, kFaultKinds - 1));
    fault.device = pick(rng, n);
    fault.position = pick(rng, static_cast<int>(calls[static_cast<std::size_t>(fault_call)].size()));
  }
  const int faulty_process = fault.device / local_n;  // global index = process offset + local index
  const std::string faulty_device = "cpu:" + std::to_string(fault.device);
  const std::string faulty_rank = "process " + std::to_string(faulty_process);

  pmap::MeshOptions options;
  options.collective_timeout = std::chrono::milliseconds(2000);
  options.process_timeout = std::chrono::milliseconds(2000);
  const auto sleep = std::chrono::milliseconds(3000);  // past both timeouts
  std::string mesh_name;
  for (const auto& a : axes) mesh_name += (mesh_name.empty() ? "" : "x") + std::to_string(a.size);
  std::printf("FAULT_STRESS rank %d seed %u: %d processes x %d devices, mesh %s, %zu calls; fault: %s", rank, seed,
              procs, local_n, mesh_name.c_str(), calls.size(), fault_name(fault.kind));
  if (fault.kind != FaultKind::none)
    std::printf(" on %s (%s) in call %d before collective %d", faulty_device.c_str(), faulty_rank.c_str(), fault_call,
                fault.position);
  std::printf("\n");
  std::fflush(stdout);

  std::vector<std::string> failures;
  const auto t0 = std::chrono::steady_clock::now();
  {
    pmap::Mesh mesh(pmap::distributed::global_devices(pmap::DeviceKind::cpu, local_n), axes, options);
    const pmap::AxisNames& all = axis_choices.back();
    bool failed = false;
    for (int c = 0; c < static_cast<int>(calls.size()) && !failed; ++c) {
      const bool faulted = c == fault_call && fault.kind != FaultKind::none;
      const Outcome o = run_call(mesh, calls[static_cast<std::size_t>(c)], c == fault_call ? fault : Fault{}, all, sleep);
      if (o.raised)
        std::printf("FAULT_STRESS rank %d: call %d raised %s: %s\n", rank, c, o.kind.c_str(), o.message.c_str());
      if (!faulted) {
        if (o.raised) failures.push_back("call " + std::to_string(c) + " without a fault raised " + o.kind);
        if (!o.right) failures.push_back("call " + std::to_string(c) + " gave a wrong result");
        continue;
      }
      failed = true;
      const bool may_finish = rank == faulty_process && local_n == 1 && fault.kind == FaultKind::early_return;
      if (!o.raised && !may_finish) failures.push_back("the faulted call did not raise on this process");
      if (o.raised && o.message.find(faulty_device) == std::string::npos &&
          o.message.find(faulty_rank) == std::string::npos)
        failures.push_back("the error names neither " + faulty_device + " nor " + faulty_rank);
      if (o.raised && rank == faulty_process && fault.kind == FaultKind::exception && o.kind != "ValueError")
        failures.push_back("the faulty process raised " + o.kind + ", not its own ValueError");
    }
    // The next call: refused on every process after a fault, fine without one.
    const Outcome next =
        run_call(mesh, {Op{CollectiveKind::psum, all, 3}, Op{CollectiveKind::barrier, all, 1}}, Fault{}, all, sleep);
    std::printf("FAULT_STRESS rank %d: the next call %s%s%s\n", rank, next.raised ? "raised " : "succeeded",
                next.kind.c_str(), next.raised ? (": " + next.message).c_str() : "");
    if (fault.kind == FaultKind::none && (next.raised || !next.right))
      failures.push_back("the next call after fault-free calls failed");
    if (fault.kind != FaultKind::none && !next.raised) failures.push_back("the next call after a fault succeeded");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Bounded: a fault costs at most the sleep, a process timeout for the faulted call and one for the next.
  if (seconds > 12) failures.push_back("took " + std::to_string(seconds) + " s");
  std::string verdict = failures.empty() ? "ok" : "FAILED:";
  for (const auto& f : failures) verdict += " " + f + ";";
  std::printf("VERDICT rank %d: %s (%.1f s)\n", rank, verdict.c_str(), seconds);
  std::fflush(stdout);
  wait_for_verdicts(rank, procs, verdict);
  return failures.empty() ? 0 : 1;
}
