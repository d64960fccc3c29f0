// ThreadHub: the shared-memory rendezvous behind CPU-device collectives in one process. Every device
// posts its k-th collective in its slot; a collective runs once all devices of its group have posted
// the same k-th call. Because calls are numbered per device, the hub also sees devices that called a
// different collective (op, shape, dtype or axis) at the same point, devices that returned early,
// devices that failed (abort), and devices that never came (timeout): none of these can hang.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
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
};

// A set of mesh devices that communicate along one axis tuple; members are listed in rank order.
struct Group {
  std::vector<int> members;
  std::string axes;  // "'data'" or "('data', 'model')", for messages and for the cross-device check
};

class ThreadHub {
 public:
  ThreadHub(std::vector<std::string> device_names, std::chrono::milliseconds timeout);

  // Clears all state for a new pmap call. No device may be inside a collective.
  void reset();
  // The device's function has returned (normally, or by an exception when `failed`): it will post
  // nothing more. Peers waiting for it raise CollectiveMismatch (returned early) or Aborted (failed).
  void finished(int device, bool failed);
  // Cancels pending and future collectives of this call: waiters raise Aborted with `reason`.
  void abort(const std::string& reason);
  // Runs `op` for `device`, which is rank `rank` of `group`. Blocks until the whole group is done.
  void collective(int device, const Group& group, int rank, const CollectiveOp& op);

 private:
  // What a device called as its k-th collective, kept for the last kHistory calls so a device that
  // has already moved on can still be compared with one that arrives late.
  struct Posted {
    std::uint64_t seq = 0;
    CollectiveOp op;
    const Group* group = nullptr;
    bool withdrawn = false;  // the device raised instead of running this call: its group can never complete
  };
  static constexpr std::size_t kHistory = 16;
  struct Slot {
    std::uint64_t seq = 0;   // number of the last collective posted (1-based)
    std::uint64_t done = 0;  // number of the last collective whose data movement this device finished
    bool finished = false;  // returned normally
    CollectiveOp op;
    const Group* group = nullptr;
    Posted history[kHistory];
  };
  std::string describe(const std::string& device_name, const Posted& p) const;
  std::string find_divergence(int device, const Group& group, std::uint64_t seq) const;
  bool all_arrived(const Group& group, std::uint64_t seq) const;
  // Every member of the group posted call `seq` with the same signature and none withdrew: the call runs.
  // Postings change only under the lock and a device withdraws only after finding this false, so all
  // members reach the same verdict.
  bool group_complete(const Group& group, std::uint64_t seq) const;
  std::string missing(const Group& group, std::uint64_t seq) const;
  std::string describe(int device) const;
  // Marks the device's call `seq` withdrawn and wakes the others (call before raising from a collective).
  void withdraw(Slot& me, std::uint64_t seq);
  void execute(const Group& group, int rank) const;

  std::vector<std::string> names_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  bool aborted_ = false;
  std::string reason_;
};

// A Communicator for one device in one group, backed by a ThreadHub.
class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadHub& hub, const Group& group, int device, int rank)
      : hub_(hub), group_(group), device_(device), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_.members.size()); }
  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) override;
  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root) override;
  void permute(const void* send, void* recv, std::size_t count, DType dtype, int send_to, int recv_from,
               std::size_t perm_id) override;
  void barrier() override;
  void abort(const std::string& reason) override { hub_.abort(reason); }
  // Runs a fully described op (lets the collectives layer pass its user-facing name).
  void run(const CollectiveOp& op) { hub_.collective(device_, group_, rank_, op); }

 private:
  ThreadHub& hub_;
  const Group& group_;
  int device_;
  int rank_;
};

}  // namespace pmap::detail
