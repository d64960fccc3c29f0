// pmapcc_mpi_tests: run under mpirun. `collectives L` checks that collectives over a mesh spanning the
// processes (L CPU devices each) are bitwise identical to one process with all the devices; `kill R`,
// `throw R`, `hang R`, `late R` (3 s), `mismatch R` make rank R fail inside an epoch-like loop of collectives, and
// `uneven R` gives rank R more local devices than the others; `cuda L` checks CUDA devices spanning the
// processes (their collectives staged through the host: bitwise one process of CPU devices; skipped
// without a GPU) and that NCCL cannot be forced onto such a mesh; `fault-stress SEED` is one randomized
// fault (mpi_fault_stress.cpp).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <pmap/pmap.h>

#include "mpi_test_support.h"

namespace {

using Bits = std::vector<std::uint32_t>;

// The collectives under test, over a 1-D ("i") or 2-D ("x", "y") mesh; every result's bits in order.
// Inputs live in host memory, or (on_device) on the device the function runs on.
Bits run_collectives(bool two_d, bool on_device = false) {
  Bits out;
  auto add = [&](const pmap::Array& a) { append_bits(out, a); };
  auto input = [&](int g, std::int64_t count) {
    pmap::Array a = hard_floats(g, count);
    return on_device ? a.to(pmap::current_device()) : std::move(a);
  };
  const pmap::AxisNames all = two_d ? pmap::AxisNames{"x", "y"} : pmap::AxisNames{"i"};
  const int g = pmap::axis_index(all), n = pmap::axis_size(all);
  pmap::Array x = input(g, 1000);
  add(pmap::psum(x, all));
  add(pmap::pmean(x, all));
  add(pmap::pmax(x, all));
  add(pmap::pmin(x, all));
  add(pmap::psum(input(g, 1 << 16), all));  // 256 KiB per device: MPI's rendezvous protocol
  add(pmap::all_gather(input(g, 7), all));
  add(pmap::all_gather(input(g, 7), all, true));
  add(pmap::psum_scatter(input(g, n * 5).reshape({n, 5}), all));
  add(pmap::psum_scatter(input(g, n * 6), all, true));
  std::vector<std::pair<int, int>> ring;
  for (int k = 0; k < n; ++k) ring.emplace_back(k, (k + 1) % n);
  add(pmap::ppermute(x, all, ring));
  add(pmap::ppermute(x, all, {{0, n - 1}}));
  add(pmap::all_to_all(input(g, n * 6).reshape({n, 6}), all, 0, 1));         // (6, n)
  add(pmap::all_to_all(input(g, 2 * n * 3).reshape({2 * n, 3}), all, 0, 0, true));
  out.push_back(static_cast<std::uint32_t>(pmap::psum(g + 1, all)));
  pmap::barrier(all);
  if (two_d) {
    for (const pmap::AxisNames& axes : {pmap::AxisNames("x"), pmap::AxisNames("y"), pmap::AxisNames{"y", "x"}}) {
      add(pmap::psum(x, axes));
      add(pmap::all_gather(input(g, 3), axes));
      out.push_back(static_cast<std::uint32_t>(pmap::axis_index(axes)));
    }
    add(pmap::psum_scatter(input(g, 4 * pmap::axis_size("y")), "y", true));
    add(pmap::all_to_all(input(g, 3 * pmap::axis_size("x")).reshape({3, pmap::axis_size("x")}), "x", 1, 0));
  }
  pmap::psum_inplace(x, all);
  add(x);
  return out;
}

int check_collectives(int local_n) {
  const int rank = pmap::distributed::process_index(), procs = pmap::distributed::process_count();
  const auto devices = pmap::distributed::global_devices(pmap::DeviceKind::cpu, local_n);
  const int n = static_cast<int>(devices.size());
  int failures = 0;
  std::vector<std::vector<pmap::AxisSpec>> shapes{{{"i", n}}};
  for (int a = 2; a < n; ++a)
    if (n % a == 0) shapes.push_back({{"x", a}, {"y", n / a}});
  for (const auto& axes : shapes) {
    const bool two_d = axes.size() == 2;
    pmap::Mesh mesh(devices, axes);
    pmap::Mesh reference(pmap::local_devices(pmap::DeviceKind::cpu, n), axes);
    auto got = pmap::pmap([&] { return run_collectives(two_d); }, mesh)();
    auto want = pmap::pmap([&] { return run_collectives(two_d); }, reference)();
    for (int i = 0; i < mesh.local_size(); ++i) {
      const int global = mesh.local_devices()[static_cast<std::size_t>(i)].index;
      const bool same = got[static_cast<std::size_t>(i)] == want[static_cast<std::size_t>(global)];
      failures += !same;
      std::printf("rank %d: %s device %s: %zu result words %s the %d-device single-process run\n", rank,
                  mesh.str().c_str(), mesh.local_devices()[static_cast<std::size_t>(i)].str().c_str(),
                  got[static_cast<std::size_t>(i)].size(), same ? "bitwise equal to" : "DIFFER from", n);
    }
  }
  failures += check_sharded(devices, rank, procs);
  if (rank == 0) failures += check_order_matters(n, local_n);
  return failures == 0 ? 0 : 1;
}

// CUDA devices spanning the processes. Forcing NCCL (PMAPCC_NCCL_SINGLE_GPU=1) on a mesh whose processes
// share a GPU raises NotAvailable on every process before any GPU memory or stream is touched (checked
// even without a GPU); then, where the processes share GPUs (as on a one-GPU machine), a 1-D mesh of
// local_n CUDA devices per process gives results bitwise equal to one process of CPU devices: its
// collectives meet through the host, in device order. With a GPU of its own for every device the mesh
// runs NCCL (bootstrapped over MPI), whose float sums may differ in the last bits: not compared here.
int check_cuda(int local_n) {
  const int rank = pmap::distributed::process_index(), procs = pmap::distributed::process_count();
  int failures = 0;
  std::vector<pmap::Device> fake;  // one CUDA device per process; never touched
  for (int p = 0; p < procs; ++p) fake.push_back(pmap::Device{pmap::DeviceKind::cuda, p, 0, p});
  setenv("PMAPCC_NCCL_SINGLE_GPU", "1", 1);
  try {
    pmap::Mesh forced(fake, "i");
    std::printf("rank %d: FAILED: a CUDA mesh spanning processes accepted PMAPCC_NCCL_SINGLE_GPU=1\n", rank);
    ++failures;
  } catch (const pmap::NotAvailable& e) {
    std::printf("rank %d: NCCL across processes refused: %s\n", rank, e.what());
  }
  unsetenv("PMAPCC_NCCL_SINGLE_GPU");
  if (pmap::cuda_device_count() == 0) {
    std::printf("rank %d: no GPU: CUDA mesh across processes skipped\n", rank);
    return failures == 0 ? 0 : 1;
  }
  if (pmap::cuda_device_count() >= local_n * procs) {
    std::printf("rank %d: %d GPUs give every device its own (NCCL): the bitwise check needs shared GPUs; skipped\n",
                rank, pmap::cuda_device_count());
    return failures == 0 ? 0 : 1;
  }
  const auto devices = pmap::distributed::global_devices(pmap::DeviceKind::cuda, local_n);
  const int n = static_cast<int>(devices.size());
  pmap::Mesh mesh(devices, "i");
  pmap::Mesh reference(pmap::local_devices(pmap::DeviceKind::cpu, n), "i");
  auto got = pmap::pmap([&] { return run_collectives(false, true); }, mesh)();
  auto want = pmap::pmap([&] { return run_collectives(false); }, reference)();
  for (int i = 0; i < mesh.local_size(); ++i) {
    const int global = mesh.local_devices()[static_cast<std::size_t>(i)].index;
    const bool same = got[static_cast<std::size_t>(i)] == want[static_cast<std::size_t>(global)];
    failures += !same;
    std::printf("rank %d: %s device %s: %zu result words %s the %d-CPU-device single-process run\n", rank,
                mesh.str().c_str(), mesh.local_devices()[static_cast<std::size_t>(i)].str().c_str(),
                got[static_cast<std::size_t>(i)].size(), same ? "bitwise equal to" : "DIFFER from", n);
  }
  return failures == 0 ? 0 : 1;
}

int report(const pmap::Error& e, int who, int linger_ms = 1500) {
  // The failing rank reports its own error; the others report how they learnt of it.
  const int rank = pmap::distributed::process_index();
  std::printf("%s=%lld rank %d: %s: %s\n", rank == who ? "RAISED_AT_MS" : "DETECTED_AT_MS", now_ms(), rank,
              error_kind(e), e.what());
  std::fflush(stdout);
  // mpirun tears the whole job down when the first process exits non-zero: linger so that the others
  // (which may be slow to learn of the failure on a loaded machine) get their reports out first.
  std::this_thread::sleep_for(std::chrono::milliseconds(rank == who ? 3000 : linger_ms));
  return 3;
}

// Rank `who` asks for 3 local devices, the others for 2: every process must raise ValueError.
int run_uneven(int who) {
  const int rank = pmap::distributed::process_index();
  if (rank == who) std::printf("FAIL_AT_MS=%lld rank %d: uneven\n", now_ms(), rank);
  try {
    pmap::distributed::global_devices(pmap::DeviceKind::cpu, rank == who ? 3 : 2);
  } catch (const pmap::Error& e) {
    return report(e, who);
  }
  return 0;
}

// Rank `who` fails as `mode` says at step 3 of 8; every process loops pmaps of collectives.
int run_failure(const std::string& mode, int who) {
  const int rank = pmap::distributed::process_index();
  try {
    pmap::Mesh mesh(pmap::distributed::global_devices(pmap::DeviceKind::cpu, 2), "i");
    for (int step = 0; step < 8; ++step) {
      pmap::pmap([&] {
        const int g = pmap::axis_index("i");
        // late: messages small enough to go eagerly, so the late rank finds the others' already there.
        pmap::Array x = hard_floats(g, mode == "late" ? 4 : 4096);
        for (int k = 0; k < 20; ++k) {
          x = pmap::pmean(x, "i");
          if (step != 3 || k != 10 || rank != who) continue;
          const bool first = pmap::axis_index("i") % 2 == 0;  // the process's first device
          if (first) {
            std::printf("FAIL_AT_MS=%lld rank %d: %s\n", now_ms(), rank, mode.c_str());
            std::fflush(stdout);
          }
          if (mode == "mismatch") {
            x = pmap::pmax(x, "i");  // every device of this process: a different collective
            continue;
          }
          if (!first) continue;
          if (mode == "kill") std::raise(SIGKILL);
          if (mode == "throw") throw pmap::ValueError("injected failure on rank " + std::to_string(rank));
          if (mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(120));
          if (mode == "late") std::this_thread::sleep_for(std::chrono::seconds(3));  // past a 1 s timeout
        }
      }, mesh)();
    }
  } catch (const pmap::Error& e) {
    return report(e, who, mode == "late" ? 4000 : 1500);  // late: until the late rank has woken and reported
  }
  std::printf("rank %d: finished without an error\n", rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pmap::distributed::initialize();
  const std::string mode = argc > 1 ? argv[1] : "collectives";
  const int arg = argc > 2 ? std::atoi(argv[2]) : 2;
  if (mode == "collectives") return check_collectives(arg);
  if (mode == "uneven") return run_uneven(arg);
  if (mode == "trainer") return check_trainer(arg);
  if (mode == "cuda") return check_cuda(arg);
  if (mode == "kill" || mode == "throw" || mode == "hang" || mode == "late" || mode == "mismatch")
    return run_failure(mode, arg);
  if (mode == "fault-stress" && argc > 2) return run_fault_stress(static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10)));
  std::fprintf(stderr, "usage: %s collectives|cuda|trainer LOCAL_DEVICES | kill|throw|hang|late|mismatch|uneven RANK | fault-stress SEED\n",
               argv[0]);
  return 2;
}
