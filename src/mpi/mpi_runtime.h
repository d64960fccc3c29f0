// The process-wide MPI state behind pmap::distributed: initialization, the lock that serializes every
// MPI call of the process, the control communicator, and the job's failure state (notices).
#pragma once

#include <mpi.h>

#include <mutex>
#include <string>

#include <pmap/detail/check.h>

namespace pmap::detail::mpi {

// PMAPCC_MPI_CHECK(call): the MPI member of the checking macro family (pmap/detail/check.h). Unless the
// call returns MPI_SUCCESS, raises MpiError naming the call, file:line, this process and MPI's message.
[[noreturn]] void throw_mpi_error(int rc, const CheckSite& site);
#define PMAPCC_MPI_CHECK(call) PMAPCC_CHECK_GEN(call, MPI_SUCCESS, ::pmap::detail::mpi::throw_mpi_error)

// pmapcc asks for MPI_THREAD_SERIALIZED and makes every MPI call under this lock: worker threads of
// several groups may exchange at once, one MPI call at a time, and Open MPI's progress engine is
// shared, so polling any request moves all of them. Only non-blocking calls are made under it, except
// at setup (communicator creation), so no thread holds it for long.
std::unique_lock<std::mutex> lock();

// Tags on the control communicator.
inline constexpr int kNoticeTag = 1;
inline constexpr int kGatherTag = 2;
// Tag on a group's communicator.
inline constexpr int kCollectiveTag = 3;

// True between initialize() with MPI and shutdown(); rank and size of MPI_COMM_WORLD.
bool active();
int world_rank();
int world_size();
// A duplicate of MPI_COMM_WORLD for gathers and failure notices (errors return, they do not abort).
MPI_Comm control();

// The job's failure state as this process knows it: "" while healthy, else why the processes can no
// longer work in step (this process's own failure, or another's notice). Never cleared.
std::string failure();
bool failed();
// Caller holds lock(): takes in a failure notice from another process, if one has arrived.
void poll_notices_locked();
// Caller holds lock(): like poll_notices_locked, but gives MPI's progress engine several turns first. One
// turn takes in only part of what has come (Open MPI's shared-memory transport, for one, may hand a notice
// queued behind a collective's message to the next turn), so one poll can miss a notice already here.
void drain_notices_locked();
// Records `what` as the job's failure and, if it is the first one this process knows of, sends it to
// every other process so that they raise instead of waiting (best effort, waits at most ~50 ms). Never
// throws.
void broadcast_failure(const std::string& what) noexcept;

}  // namespace pmap::detail::mpi
