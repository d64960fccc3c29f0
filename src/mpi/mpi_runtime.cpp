// MPI initialization and shutdown for pmap::distributed, the process-wide MPI lock, and failure
// notices: the first failure a process sees is sent to every other process on the control communicator.
#include "mpi_runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include <pmap/error.h>

#include "processes.h"

namespace pmap::detail::mpi {
namespace {

constexpr int kNoticeBytes = 1024;

struct Runtime {
  std::mutex mpi_mu;  // lock()
  bool initialized = false;  // initialize() ran (with or without MPI)
  bool active = false;       // MPI is usable by pmapcc
  bool owns = false;         // pmapcc called MPI_Init_thread, so it finalizes
  int rank = 0;
  int size = 1;
  MPI_Comm control = MPI_COMM_NULL;
  MPI_Request notice = MPI_REQUEST_NULL;  // posted receive for another process's failure notice
  char notice_in[kNoticeBytes] = {};
  std::string notice_out;  // what this process sent; outlives the sends
  std::atomic<bool> failed{false};
  std::mutex failure_mu;
  std::string failure;
};

Runtime& state() {
  static Runtime* rt = new Runtime;  // never destroyed: at-exit code may still ask for it
  return *rt;
}

bool launched_by_mpi_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

// Records the failure; true when it is the first.
bool record_failure(const std::string& what) {
  Runtime& rt = state();
  std::lock_guard lk(rt.failure_mu);
  if (rt.failed.load()) return false;
  rt.failure = what;
  rt.failed.store(true);
  return true;
}

void at_exit() { shutdown_processes(); }

}  // namespace

void throw_mpi_error(int rc, const CheckSite& site) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw MpiError(check_message(site, "process " + std::to_string(state().rank),
                               std::string(text, static_cast<std::size_t>(len))));
}

std::unique_lock<std::mutex> lock() { return std::unique_lock(state().mpi_mu); }

bool active() { return state().active; }
int world_rank() { return state().rank; }
int world_size() { return state().size; }
MPI_Comm control() { return state().control; }

bool failed() { return state().failed.load(); }

std::string failure() {
  Runtime& rt = state();
  std::lock_guard lk(rt.failure_mu);
  return rt.failure;
}

void poll_notices_locked() {
  Runtime& rt = state();
  if (rt.notice == MPI_REQUEST_NULL) return;
  int arrived = 0;
  MPI_Status status;
  if (MPI_Test(&rt.notice, &arrived, &status) != MPI_SUCCESS || !arrived) return;
  int len = 0;
  MPI_Get_count(&status, MPI_CHAR, &len);
  record_failure(std::string(rt.notice_in, static_cast<std::size_t>(std::max(0, len))));
}

void drain_notices_locked() {
  // 32 turns: each costs well under a microsecond when nothing has come.
  for (int turn = 0; turn < 32 && !failed(); ++turn) poll_notices_locked();
}

void broadcast_failure(const std::string& what) noexcept {
  try {
    if (!record_failure(what) || !active()) return;
    Runtime& rt = state();
    std::vector<MPI_Request> sends;
    {
      auto lk = lock();
      rt.notice_out = what.substr(0, kNoticeBytes);
      for (int r = 0; r < rt.size; ++r) {
        MPI_Request req = MPI_REQUEST_NULL;
        if (r != rt.rank && MPI_Isend(rt.notice_out.data(), static_cast<int>(rt.notice_out.size()), MPI_CHAR, r,
                                      kNoticeTag, rt.control, &req) == MPI_SUCCESS)
          sends.push_back(req);
      }
    }
    // A send completes only once the peer's MPI makes progress, which a lost or stuck process never
    // does: give the others a moment, then let the sends go on without us (the text outlives them).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    for (;;) {
      int done = 0;
      {
        auto lk = lock();
        MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE);
        if (!done && std::chrono::steady_clock::now() > deadline) {
          for (auto& req : sends)
            if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);
          done = 1;
        }
      }
      if (done) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (...) {
  }
}

}  // namespace pmap::detail::mpi

namespace pmap::detail {

bool initialize_processes() {
  using namespace mpi;
  Runtime& rt = state();
  auto lk = lock();
  if (rt.initialized) return rt.size > 1;
  int already = 0;
  PMAPCC_MPI_CHECK(MPI_Initialized(&already));
  if (!already && !launched_by_mpi_launcher()) {
    rt.initialized = true;  // a plain single-process run: no MPI at all
    return false;
  }
  int provided = MPI_THREAD_SINGLE;
  if (!already) {
    PMAPCC_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    rt.owns = true;
    std::atexit(at_exit);
  } else {
    PMAPCC_MPI_CHECK(MPI_Query_thread(&provided));
  }
  if (provided < MPI_THREAD_SERIALIZED)
    throw MpiError("pmapcc needs MPI_THREAD_SERIALIZED (its worker threads call MPI one at a time), but MPI "
                   "provides only level " + std::to_string(provided) +
                   (already ? ": initialize MPI with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...)" : ""));
  PMAPCC_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  PMAPCC_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rt.rank));
  PMAPCC_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &rt.size));
  PMAPCC_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &rt.control));
  PMAPCC_MPI_CHECK(MPI_Comm_set_errhandler(rt.control, MPI_ERRORS_RETURN));
  PMAPCC_MPI_CHECK(MPI_Irecv(rt.notice_in, kNoticeBytes, MPI_CHAR, MPI_ANY_SOURCE, kNoticeTag, rt.control, &rt.notice));
  rt.initialized = true;
  rt.active = true;
  return rt.size > 1;
}

void shutdown_processes() {
  using namespace mpi;
  Runtime& rt = state();
  auto lk = lock();
  if (!rt.active) return;
  rt.active = false;
  // After a failure requests may stay pending forever and MPI_Finalize could wait for a lost process:
  // leave MPI to the process exit (the launcher then reports the job as failed, which it is).
  if (rt.failed.load()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Cancel(&rt.notice);
  MPI_Wait(&rt.notice, MPI_STATUS_IGNORE);
  MPI_Comm_free(&rt.control);
  if (rt.owns) MPI_Finalize();
}

int process_index() { return mpi::state().rank; }
int process_count() { return mpi::state().size; }

}  // namespace pmap::detail
