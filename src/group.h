// Group: a set of mesh devices that communicate along one axis tuple, as this process sees it, and the
// RemoteExchange that carries its collectives between processes when its devices live in several. The
// vocabulary every communicator shares (threads, NCCL, MPI); the op itself is pmap::CollectiveOp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <pmap/collective_op.h>

namespace pmap::detail {

// How a collective's data moves once its group has met in the thread hub.
enum class DataPath : std::uint8_t {
  host,    // host memory: the hub's threads copy and reduce it (CPU devices, or staged CUDA arrays)
  device,  // device memory of one GPU (virtual devices) or peers: device_execute moves it
  none,    // the hub only checks signatures; the caller moves the data (NCCL)
};

// Moves a collective's data between processes, for a group whose devices live in several processes
// (src/mpi). The hub first gathers the group's devices of this process; then the first of them calls
// exchange() while the others wait, and once it has succeeded every one of them calls finish() (unless the
// path is none: then NCCL moves the data).
class RemoteExchange {
 public:
  virtual ~RemoteExchange() = default;
  // Sends this process's contributions and receives every other process's. `ops`: the local members'
  // ops in local rank order, already checked to agree; `path`: none when only the signatures travel
  // (NCCL moves the data), else host; `seq`: the collective's number in this pmap call; `cancelled()`
  // turns true when this process aborts the call. Raises CollectiveMismatch, Timeout (a process never
  // came), Aborted (a process failed, or cancelled) or MpiError.
  virtual void exchange(const std::vector<const CollectiveOp*>& ops, DataPath path, std::uint64_t seq,
                        const std::function<bool()>& cancelled) = 0;
  // Writes the results of local member `local_rank` (of `local_count`) from the exchanged data. The
  // members share the work of an all_reduce, so all of them must call it.
  virtual void finish(const CollectiveOp& op, int local_rank, int local_count) = 0;
};

// `members` are the group's devices that this process runs, in rank order. In a single-process mesh
// that is the whole group (ranks 0..size-1) and `remote` is null.
struct Group {
  std::vector<int> members;
  std::string axes;                  // "'data'" or "('data', 'model')", for messages and the cross-device check
  std::vector<int> ranks;            // members[k]'s rank in the whole group
  int size = 0;                      // devices in the whole group, over every process
  RemoteExchange* remote = nullptr;  // set when the group spans processes
};

}  // namespace pmap::detail
