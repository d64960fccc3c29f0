// ThreadCommunicator: a device's collectives through the thread hub.
#include "thread_communicator.h"

#include <pmap/detail/capture.h>
#include <pmap/error.h>

#include "cuda_seam.h"

namespace pmap::detail {

ThreadCommunicator::ThreadCommunicator(ThreadHub& hub, const Group& group, int device, int local_rank,
                                       bool device_memory)
    : hub_(hub), group_(group), device_(device), local_rank_(local_rank), device_memory_(device_memory) {
  if (device_memory_ && group_.remote != nullptr)
    throw NotAvailable("collectives over " + group_.axes +
                       " span processes, so they move host memory over MPI: device-memory collectives (the "
                       "device hub of virtual CUDA devices) work only within one process");
}

void ThreadCommunicator::run(const CollectiveOp& op) {
  // Under a capture only when captures() (src/collectives.cpp's target() refuses the rest): this device's
  // own data movement, recorded, with no peer to meet or synchronize for.
  if (capturing() != nullptr) {
    if (CollectiveLog* log = CollectiveLog::current()) log->note(this, op);
    return device_execute(op, {op.send}, {op.recv}, 0, /*synchronize=*/false);
  }
  if (device_memory_) cuda_sync_current_stream();  // peers read our send buffer from their streams
  hub_.collective(device_, group_, local_rank_, op, device_memory_ ? DataPath::device : DataPath::host);
}

}  // namespace pmap::detail
