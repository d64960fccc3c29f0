// The seam between the mesh and NCCL (CUDA-free): a mesh whose devices are one per GPU gets one root NCCL
// communicator per device over all devices (ncclCommInitAll), and, per axis tuple, each device's
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
  // tuple), split from d's root. Called on d's worker thread with its GPU and stream current; every device
  // of the mesh calls it for the same tuples in the same order (the split is collective over the root).
  // Ends with a barrier (a one-element all_reduce and a stream synchronization), so a communicator that
  // cannot talk fails here, at mesh construction. Waits at most the mesh's collective timeout.
  virtual std::unique_ptr<Communicator> split(int device, int color, int rank, const Group& group) = 0;
  // Destroys device d's root communicator; called on d's worker thread after its split communicators
  // are gone. Never throws.
  virtual void release(int device) noexcept = 0;
};

// Root communicators on the GPUs `ordinals` (one device per GPU, all distinct), created together from the
// calling thread. The communicators raise NcclError / Timeout / Aborted from their collectives, checking
// every call against the other devices in `hub` first (so a mismatch raises instead of hanging).
std::unique_ptr<NcclClique> make_nccl_clique(const std::vector<int>& ordinals, ThreadHub& hub,
                                             std::chrono::milliseconds timeout);

}  // namespace pmap::detail
