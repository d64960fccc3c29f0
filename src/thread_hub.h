// ThreadHub: the shared-memory rendezvous behind CPU-device collectives in one process. Every device
// posts its k-th collective in its slot; a collective runs once all devices of its group have posted
// the same k-th call. Because calls are numbered per device, the hub also sees devices that called a
// different collective (op, shape, dtype or axis) at the same point, devices that returned early,
// devices that failed (abort), and devices that never came (timeout): none of these can hang.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <pmap/collective_op.h>
#include <pmap/dtype.h>

#include "group.h"

namespace pmap::detail {

class ThreadHub {
 public:
  // device_names: every device of the mesh; local[d]: device d runs in this process.
  ThreadHub(std::vector<std::string> device_names, std::vector<bool> local, std::chrono::milliseconds timeout);

  // Clears all state for a new pmap call. No device may be inside a collective.
  void reset();
  // The device's function has returned (normally, or by an exception when `failed`): it will post
  // nothing more. Peers waiting for it raise CollectiveMismatch (returned early) or Aborted (failed).
  void finished(int device, bool failed);
  // Cancels pending and future collectives of this call: waiters raise Aborted with `reason`, or Timeout
  // when the cancellation is a timeout (a device that waited past the deadline): every waiting device
  // then sees the same Timeout, and Aborted means that another device failed.
  void abort(const std::string& reason, bool timeout = false);
  // Runs `op` for `device`, which is group.members[rank], its data moving by `path`. Blocks until the
  // whole group is done: post(), await_group(), move_data(), await_done().
  void collective(int device, const Group& group, int rank, const CollectiveOp& op, DataPath path);
  // Why this call was aborted, or "" while it is not (polled by communicators that wait elsewhere).
  std::string abort_reason() const;
  // Whether that abort is a timeout (see abort).
  bool aborted_by_timeout() const;

 private:
  // What a device called as its k-th collective, kept for the last kHistory calls so a device that
  // has already moved on can still be compared with one that arrives late.
  struct Posted {
    std::uint64_t seq = 0;
    CollectiveOp op;
    const Group* group = nullptr;
    DataPath path = DataPath::host;
  };
  static constexpr std::size_t kHistory = 16;
  enum class FailureKind : std::uint8_t { none, mismatch, timeout, aborted, other };
  struct OpFailure {
    FailureKind kind = FailureKind::none;
    std::string message;
  };
  struct Slot {
    std::uint64_t seq = 0;   // number of the last collective posted (1-based)
    std::uint64_t done = 0;  // number of the last collective whose data movement this device finished
    bool finished = false;  // returned normally
    std::uint64_t exchanged = 0;  // remote groups, on the leader: the last collective exchanged
    OpFailure remote_failure;     // ... and how that exchange failed, if it did
    Posted posted;                // the collective #seq
    Posted history[kHistory];
  };
  // The steps of collective(), each called and returning with `lk` held. A step that raises has withdrawn
  // the device's post (await_group) or waited for its peers (move_data); the caller only rethrows.
  std::uint64_t post(int device, const Group& group, const CollectiveOp& op, DataPath path);
  void await_group(int device, const Group& group, std::uint64_t seq, std::unique_lock<std::mutex>& lk);
  std::exception_ptr move_data(int device, const Group& group, int rank, std::uint64_t seq,
                               std::unique_lock<std::mutex>& lk);
  void await_done(const Group& group, std::uint64_t seq, std::unique_lock<std::mutex>& lk);
  // Takes back the post of collective #seq (so no peer counts this device as arrived) and throws.
  template <class E>
  [[noreturn]] void withdraw(int device, std::uint64_t seq, E error);

  std::string describe(const std::string& device_name, const Posted& p) const;
  std::string find_divergence(int device, const Group& group, std::uint64_t seq, bool group_only) const;
  bool all_arrived(const Group& group, std::uint64_t seq) const;
  std::string missing(const Group& group, std::uint64_t seq) const;
  // Whether every member missing from collective #seq is inside an earlier collective (posted, not done).
  bool missing_wait_elsewhere(const Group& group, std::uint64_t seq) const;
  // When an exchange with other processes timed out in collective #seq: this process's devices that have
  // not reached it and are in no collective (returned early, or busy), which the missing process may be
  // waiting for; "" when there are none. So a chain of waits across processes still names its cause.
  std::string local_suspects(std::uint64_t seq) const;
  std::string describe(int device) const;
  void execute(const Group& group, int rank) const;
  // Remote groups: the leader (local rank 0) runs the exchange while the others wait; every member
  // then raises the leader's failure, if any. Called and returns with `lk` held.
  void exchange_remote(const Group& group, int rank, std::uint64_t seq, std::unique_lock<std::mutex>& lk);
  bool is_aborted() const;

  // Every change of the shared state happens under mu_ through changed(), which bumps changes_ and wakes
  // the waiters. await() first spins briefly on changes_ without the lock (only when there are no more
  // devices than cores, so a spinning device never keeps a peer off its core), then sleeps on cv_: a
  // collective between running threads then costs microseconds instead of two sleep/wake round trips.
  // Waiters re-check their conditions under mu_ after await() returns, as with any condition variable.
  void changed();
  std::cv_status await(std::unique_lock<std::mutex>& lk, std::chrono::steady_clock::time_point deadline);

  std::vector<std::string> names_;
  std::vector<bool> local_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<std::uint64_t> changes_{0};
  bool spin_ = false;
  std::vector<Slot> slots_;
  bool aborted_ = false;
  bool timed_out_ = false;  // the abort is a timeout
  std::string reason_;
};

// Rank `rank`'s share of the data movement of a collective whose buffers (sends, recvs: every rank's, in
// rank order) are device memory the calling thread's GPU can reach (its own, or peers' with peer access
// enabled): kernels and copies on its current stream, which is then synchronized (unless `synchronize` is
// false: a one-rank group's collective recorded into a graph, which no peer reads). Reductions combine
// ranks in order 0..n-1, as the host path does, so the results are bitwise those of CPU devices. Only
// for groups within one process (the whole group is local, so local ranks are group ranks).
// src/cuda/device_hub.cu; the stub throws NotAvailable.
void device_execute(const CollectiveOp& op, const std::vector<const void*>& sends, const std::vector<void*>& recvs,
                    int rank, bool synchronize = true);

}  // namespace pmap::detail
