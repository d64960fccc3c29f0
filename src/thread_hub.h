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
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <pmap/communicator.h>
#include <pmap/dtype.h>

namespace pmap::detail {

enum class OpKind : std::uint8_t { all_reduce, all_gather, reduce_scatter, broadcast, permute, barrier };

// One device's part in one collective. `count` is in elements (per rank where the op says so).
struct CollectiveOp {
  OpKind kind = OpKind::barrier;
  ReduceOp reduce = ReduceOp::sum;
  DType dtype = DType::f32;
  std::size_t count = 0;
  int root = 0;
  std::size_t perm_id = 0;
  int send_to = -1;
  int recv_from = -1;
  const void* send = nullptr;
  void* recv = nullptr;
  const char* name = "collective";  // the user-facing name (psum, all_gather, ...), compared across devices
  bool device = false;      // send/recv are device memory of one GPU: the data moves by device_execute
  bool check_only = false;  // rendezvous and signature check only; the caller moves the data (NCCL)
};

// Moves a collective's data between processes, for a group whose devices live in several processes
// (src/mpi). The hub first gathers the group's devices of this process; then the first of them calls
// exchange() while the others wait, and once it has succeeded every one of them calls finish().
class RemoteExchange {
 public:
  virtual ~RemoteExchange() = default;
  // Sends this process's contributions and receives every other process's. `ops`: the local members'
  // ops in local rank order, already checked to agree; `seq`: the collective's number in this pmap
  // call; `cancelled()` turns true when this process aborts the call. Raises CollectiveMismatch,
  // Timeout (a process never came), Aborted (a process failed, or cancelled) or MpiError.
  virtual void exchange(const std::vector<const CollectiveOp*>& ops, std::uint64_t seq,
                        const std::function<bool()>& cancelled) = 0;
  // Writes the results of local member `local_rank` (of `local_count`) from the exchanged data. The
  // members share the work of an all_reduce, so all of them must call it.
  virtual void finish(const CollectiveOp& op, int local_rank, int local_count) = 0;
};

// A set of mesh devices that communicate along one axis tuple, as seen by this process: `members` are
// the group's devices that this process runs, in rank order. In a single-process mesh that is the
// whole group (ranks 0..size-1) and `remote` is null.
struct Group {
  std::vector<int> members;
  std::string axes;  // "'data'" or "('data', 'model')", for messages and for the cross-device check
  std::vector<int> ranks;  // members[k]'s rank in the whole group
  int size = 0;            // devices in the whole group, over every process
  RemoteExchange* remote = nullptr;  // set when the group spans processes
};

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
  // Runs `op` for `device`, which is group.members[rank]. Blocks until the whole group is done.
  void collective(int device, const Group& group, int rank, const CollectiveOp& op);
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
    CollectiveOp op;
    const Group* group = nullptr;
    Posted history[kHistory];
  };
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
// enabled): kernels and copies on its current stream, which is then synchronized. Reductions combine
// ranks in order 0..n-1, as the host path does, so the results are bitwise those of CPU devices. Only
// for groups within one process (the whole group is local, so local ranks are group ranks).
// src/cuda/device_hub.cu; the stub throws NotAvailable.
void device_execute(const CollectiveOp& op, const std::vector<const void*>& sends, const std::vector<void*>& recvs,
                    int rank);

// A communicator that also takes a fully described op, so the collectives layer can pass the user-facing
// name (psum, all_gather, ...) that mismatch and timeout messages show.
class OpRunner {
 public:
  virtual ~OpRunner() = default;
  virtual void run(CollectiveOp op) = 0;
};

// A Communicator for one device in one group, backed by a ThreadHub (and the group's RemoteExchange
// when it spans processes). `local_rank` indexes group.members; rank() and size() are the whole group's.
// With device_memory, the buffers are device memory and every member's GPU can reach every other's
// (virtual devices on one GPU, or GPUs with peer access): the hub only meets the threads, the data moves
// on the GPUs. device_memory needs a group within one process (NotAvailable otherwise: the exchange
// between processes reads and writes host memory).
class ThreadCommunicator final : public Communicator, public OpRunner {
 public:
  ThreadCommunicator(ThreadHub& hub, const Group& group, int device, int local_rank, bool device_memory = false);
  int rank() const override { return group_.ranks[static_cast<std::size_t>(local_rank_)]; }
  int size() const override { return group_.size; }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override;
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root) override;
  void permute(const void* send, void* recv, std::size_t count, DType dtype, int send_to, int recv_from,
               std::size_t perm_id) override;
  void barrier() override;
  void abort(const std::string& reason) override { hub_.abort(reason); }
  // Runs a fully described op (lets the collectives layer pass its user-facing name).
  void run(CollectiveOp op) override;
  bool device_memory() const { return device_memory_; }

 private:
  ThreadHub& hub_;
  const Group& group_;
  int device_;
  int local_rank_;
  bool device_memory_;
};

}  // namespace pmap::detail
