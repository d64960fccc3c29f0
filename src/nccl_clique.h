// The seam between the mesh and NCCL (CUDA-free): a mesh whose devices are one per GPU gets one root NCCL
// communicator per device over all of the mesh's devices, every process's (ncclCommInitRankConfig, the
// ncclUniqueId sent over MPI when the mesh spans processes), and, per axis tuple, each device's
// communicator split from its root (ncclCommSplit). src/nccl/nccl_clique.cpp; the stub in
// src/stubs/no_nccl.cpp throws NotAvailable.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include <pmap/communicator.h>

#include "thread_hub.h"

namespace pmap::detail {

class NcclClique {
 public:
  virtual ~NcclClique() = default;
  // Device d's communicator for `group` (it is rank `rank` of the group numbered `color` of its axis
  // tuple, and `local_rank` among this process's members of the group), split from d's root. Called on d's worker thread with its GPU and stream current; every device
  // of the mesh calls it for the same tuples in the same order (the split is collective over the root).
  // Ends with a barrier (a one-element all_reduce and a stream synchronization), so a communicator that
  // cannot talk fails here, at mesh construction. Waits at most the mesh's collective timeout.
  virtual std::unique_ptr<Communicator> split(int device, int color, int rank, int local_rank, const Group& group) = 0;
  // Destroys device d's root communicator (again: a no-op); called on d's worker thread by every device
  // together, once its splits are done (the mesh splits every communicator when it is built). Never throws.
  virtual void release(int device) noexcept = 0;
};

// Root communicators for this process's devices of a mesh of `size` devices: `devices[i]` (a mesh index,
// which is its NCCL rank) runs on GPU `ordinals[i]` (distinct GPUs on one host). Collective over every
// process when `spans_processes` (the process running mesh device 0 makes the ncclUniqueId and MPI
// carries it); raises Timeout when not every rank joins within `init_timeout`. The communicators raise
// NcclError / Timeout / Aborted from their collectives (waiting at most `collective_timeout`), checking
// every call against the other devices in `hub` first (so a mismatch raises instead of hanging).
std::unique_ptr<NcclClique> make_nccl_clique(const std::vector<int>& devices, const std::vector<int>& ordinals,
                                             int size, bool spans_processes, ThreadHub& hub,
                                             std::chrono::milliseconds collective_timeout,
                                             std::chrono::milliseconds init_timeout);

}  // namespace pmap::detail
