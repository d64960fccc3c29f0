// ThreadCommunicator: the Communicator of one device in one group, backed by the process's ThreadHub
// (and the group's RemoteExchange when it spans processes). rank() and size() are the whole group's.
// With device memory, the buffers are device memory and every member's GPU can reach every other's
// (virtual devices on one GPU, or GPUs with peer access): the hub only meets the threads, the data moves
// on the GPUs. That needs a group within one process (NotAvailable otherwise: the exchange between
// processes reads and writes host memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <pmap/communicator.h>

#include "group.h"
#include "thread_hub.h"

namespace pmap::detail {

class ThreadCommunicator final : public Communicator {
 public:
  // `local_rank` indexes group.members.
  ThreadCommunicator(ThreadHub& hub, const Group& group, int device, int local_rank, bool device_memory = false);
  int rank() const override { return group_.ranks[static_cast<std::size_t>(local_rank_)]; }
  int size() const override { return group_.size; }
  void run(const CollectiveOp& op) override;
  void abort(const std::string& reason) override { hub_.abort(reason); }
  // A group of one device in device memory (a one-GPU mesh): its collectives are copies and kernels on the
  // device's stream, which a graph records; there is no peer to meet or wait for at a launch.
  bool captures() const override { return device_memory_ && group_.size == 1 && group_.remote == nullptr; }
  void graph_meet(std::size_t, std::uint64_t) override {}
  void graph_wait() override {}

 private:
  ThreadHub& hub_;
  const Group& group_;
  int device_;
  int local_rank_;
  bool device_memory_;
};

}  // namespace pmap::detail
