// Communicator: how one device runs collectives with the other devices of one mesh axis (or tuple of
// axes). Implementations: threads (CPU devices in one process, and virtual CUDA devices on one GPU), NCCL
// (GPUs), MPI (devices across processes, through the thread hub). The named-axis collectives
// (pmap/collectives.h) describe each call as a CollectiveOp and run it here; nothing else is needed.
#pragma once

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
};

}  // namespace pmap
