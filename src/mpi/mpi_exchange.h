// MpiExchange: the RemoteExchange of one mesh group whose devices live in several processes. Each
// process sends one message per collective to every other process of the group: a header (the
// collective's signature: pmap call, collective number, op, dtype, count, axes) followed by its
// devices' contributions. Every process then checks every header, so a mismatch raises
// CollectiveMismatch on every process before any data is read, and each device computes its result
// from all the contributions in group rank order, exactly as the thread hub does in one process.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "peer_round.h"
#include "group.h"

namespace pmap::detail::mpi {

// Where a group's devices live, by rank of the group's communicator (processes in world rank order).
struct GroupLayout {
  std::string axes;                        // "'i'", "('x', 'y')"
  int size = 0;                            // devices in the whole group
  std::vector<std::vector<int>> ranks_of;  // by communicator rank: the group ranks it runs, ascending
  std::vector<int> process_of;             // by communicator rank: its process index (world rank)
  std::vector<std::string> names;          // by group rank: the device ("cpu:3")
};

class MpiExchange final : public RemoteExchange {
 public:
  // `comm` spans the group's processes; `epoch` is the mesh's pmap call counter (read, not owned).
  MpiExchange(MPI_Comm comm, GroupLayout layout, std::chrono::milliseconds timeout, const std::uint64_t& epoch);

  void exchange(const std::vector<const CollectiveOp*>& ops, DataPath path, std::uint64_t seq,
                const std::function<bool()>& cancelled) override;
  void finish(const CollectiveOp& op, int local_rank, int local_count) override;

 private:
  std::string process_str(int q) const;  // "process 2 (cpu:4, cpu:5)"
  void pack(const std::vector<const CollectiveOp*>& ops, std::uint64_t seq);
  void check_signatures() const;  // CollectiveMismatch when any process's header differs
  void index_contributions();     // fills sends_

  GroupLayout layout_;
  std::chrono::milliseconds timeout_;
  const std::uint64_t& epoch_;
  PeerRound round_;
  CollectiveOp op_;                     // this process's op of the current collective (leader's)
  bool check_only_ = false;             // ... whose data NCCL moves: only the signatures travel
  std::vector<const void*> sends_;      // by group rank: its contribution in the exchanged messages
  std::vector<void*> local_recvs_;      // this process's members' receive buffers, local rank order
};

}  // namespace pmap::detail::mpi
