// Communicator: how one device runs collectives with the other devices of one mesh axis (or tuple of
// axes). Implementations: threads (CPU devices in one process, and virtual CUDA devices on one GPU), NCCL
// (GPUs), MPI (devices across processes, through the thread hub). The named-axis collectives
// (pmap/collectives.h) describe each call as a CollectiveOp and run it here; nothing else is needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <pmap/collective_op.h>

namespace pmap {

class Communicator {
 public:
  virtual ~Communicator() = default;
  // This device's rank in the group, and the group's size (over every process).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Runs this device's part of `op` (see CollectiveOp). Blocks until the data has moved (buffers may be
  // reused when it returns). Raises CollectiveMismatch when the ranks disagree, Timeout when one never
  // comes, Aborted when the group was aborted (another device failed).
  virtual void run(const CollectiveOp& op) = 0;
  // Cancels every pending and future operation of this communicator's group: waiters raise Aborted.
  virtual void abort(const std::string& reason) = 0;

  // Collectives in CUDA graphs: NCCL's, and a one-device group's in device memory (false otherwise). While
  // the calling thread's stream is captured by a capturer that holds a detail::CollectiveLog (jit), run()
  // meets the peers on the host, records the op into the capture (noting it in the log) and returns
  // without waiting. Every launch of that graph is then collective, as NCCL requires of graphs holding
  // its operations: each rank calls graph_meet() before its launch and graph_wait() after.
  virtual bool captures() const { return false; }
  // Whether a graph holding this communicator's collectives must be destroyed before the communicator is
  // (NCCL's: its destroy and abort wait for such graphs): the capturer registers it (detail::hold_graph).
  virtual bool holds_graphs() const { return false; }
  // Meets the group on the host before launching a graph that holds `ops` of this communicator's
  // collectives, whose signatures (kind, dtype, count, ...) hash to `signature`, moving no data:
  // CollectiveMismatch when a rank does something else or launches another graph, Timeout, Aborted.
  virtual void graph_meet(std::size_t ops, std::uint64_t signature);
  // Waits until the launched graph's work on the calling thread's stream is done, with run()'s timeout and
  // errors (a rank whose graph never ran is a Timeout, never a hang); on an error the communicator is
  // aborted (after dropping the graphs that hold it).
  virtual void graph_wait();
};

}  // namespace pmap
