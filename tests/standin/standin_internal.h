// What the stand-in's cuBLAS (cublas.cpp) and NCCL (nccl.cpp) use of its runtime (runtime.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace pmapcc_standin {

// The injected failure of `api`'s next call (cudaSuccess when none): a cudaError_t, or another
// library's status as an int.
cudaError_t injected(const char* api);
// The calling thread's current device.
int current_device();
// PMAPCC_STANDIN_NODE: the machine this process plays (its fake GPUs are its own, and NCCL communicators
// meet other processes' through files); -1 when unset (one process: communicators meet in memory).
int node();

struct StreamInfo {
  bool valid = false;
  int device = -1;
  bool capturing = false;
};
// What `stream` is (nullptr: the current device's legacy stream).
StreamInfo stream_info(cudaStream_t stream);
// The GPU whose device memory holds [p, p + bytes), or -1 when it is not one allocation of device memory.
int pointer_device(const void* p, std::size_t bytes);
// Queues op on `stream` (or records it into the stream's capture). `device`: the GPU whose legacy stream a
// null `stream` names (-1: the calling thread's current device; NCCL's launcher thread has none of its own).
cudaError_t enqueue(cudaStream_t stream, std::function<void()> op, int device = -1);

}  // namespace pmapcc_standin
