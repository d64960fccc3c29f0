// CollectiveOp: one device's part in one collective, the unit every Communicator runs. Counts are in
// elements, never bytes. Collectives are SPMD: every rank of the group runs an op of the same kind,
// reduction, dtype, count, root and permutation id, with the same name, in the same order; the
// communicators check this and raise CollectiveMismatch naming both sides instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmap/dtype.h>

namespace pmap {

enum class ReduceOp : unsigned char { sum, max, min };

enum class CollectiveKind : std::uint8_t {
  all_reduce,      // recv[i] = reduce over ranks (in rank order 0..n-1) of send[i]; send may equal recv
  all_gather,      // recv (size * count elements) = the ranks' send buffers (count each) in rank order
  reduce_scatter,  // recv (count) = reduce over ranks of send[rank * count, (rank + 1) * count) (send: size * count)
  broadcast,       // recv (count) = root's send
  permute,         // send goes to rank send_to; recv comes from rank recv_from (-1: none, recv zero-filled)
  barrier,         // no data
};

struct CollectiveOp {
  CollectiveKind kind = CollectiveKind::barrier;
  ReduceOp reduce = ReduceOp::sum;  // all_reduce, reduce_scatter
  DType dtype = DType::f32;
  std::size_t count = 0;
  int root = 0;              // broadcast
  std::size_t perm_id = 0;   // permute: identifies the permutation, so ranks using different ones are caught
  int send_to = -1;          // permute
  int recv_from = -1;        // permute
  const void* send = nullptr;
  void* recv = nullptr;
  const char* name = "collective";  // the user-facing name (psum, all_gather, ...): in messages, and compared
  // Recorded into a CUDA graph rather than run now (jit's capture, over NCCL). Compared: NCCL requires every
  // rank of a collective to capture it or none, so a rank recording it and one running it is a mismatch.
  bool recorded = false;
};

}  // namespace pmap
