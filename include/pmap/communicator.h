// Communicator: the collective operations one device performs with the other devices of one mesh
// axis (or tuple of axes). Implementations: threads (CPU devices in one process), NCCL (GPUs),
// MPI (CPU devices across processes). Counts are in elements, never bytes. All calls are blocking
// and SPMD: every rank calls the same operation with the same count and dtype, in the same order.
#pragma once

#include <cstddef>
#include <string>

#include <pmap/dtype.h>

namespace pmap {

enum class ReduceOp : unsigned char { sum, max, min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv[i] = op over ranks (in rank order 0..n-1) of send[i]; send may equal recv.
  virtual void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) = 0;
  // recv (size*count elements) = the ranks' send buffers (count each) in rank order.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType dtype) = 0;
  // recv (count elements) = op over ranks of send[rank*count : (rank+1)*count] (send has size*count).
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op) = 0;
  // recv = root's send (count elements).
  virtual void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root) = 0;
  // Sends `send` to rank send_to and receives from rank recv_from (-1: none; recv is zero-filled).
  // perm_id identifies the permutation so that ranks using different permutations are caught.
  virtual void permute(const void* send, void* recv, std::size_t count, DType dtype, int send_to, int recv_from,
                       std::size_t perm_id) = 0;
  virtual void barrier() = 0;
  // Cancels every pending and future operation of this communicator's group: waiters raise Aborted.
  virtual void abort(const std::string& reason) = 0;
};

}  // namespace pmap
