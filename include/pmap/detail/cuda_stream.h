// The calling thread's current CUDA stream: every kernel launch, cuBLAS call and copy pmapcc makes on a
// CUDA device goes to it. pmap sets it on each worker thread to its logical device's stream (virtual
// devices sharing a GPU each have their own); elsewhere it is the legacy default stream (nullptr).
// Internal to pmapcc's CUDA sources (src/, kernels/).
#pragma once

#include <cuda_runtime_api.h>

#include <pmap/detail/cuda_check.h>

namespace pmap::detail {

// The stream work of the calling thread goes to. Never throws.
cudaStream_t current_stream() noexcept;

// Makes `stream` the calling thread's current stream; returns the previous one. Never throws: a stream whose
// GPU cannot be queried is kept with no GPU (stream_for_gpu then gives every GPU's legacy stream). For
// restoring a stream that was current before.
cudaStream_t exchange_current_stream(cudaStream_t stream) noexcept;
// The same, raising CudaError (and changing nothing) when the stream's GPU cannot be queried (review L3).
cudaStream_t exchange_current_stream_checked(cudaStream_t stream);

// Sets the current stream for a scope and restores the previous one on exit. Raises as
// exchange_current_stream_checked.
class StreamScope {
 public:
  explicit StreamScope(cudaStream_t stream) : previous_(exchange_current_stream_checked(stream)) {}
  ~StreamScope() { exchange_current_stream(previous_); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t previous_;
};

// The stream for work on GPU `ordinal`: the current stream when it lives on that GPU, else that GPU's
// legacy default stream (a thread working on another GPU's memory). Never throws.
cudaStream_t stream_for_gpu(int ordinal) noexcept;

// Makes GPU `ordinal` current for a scope and restores the previous one on exit.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    PMAPCC_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal) PMAPCC_CUDA_CHECK(cudaSetDevice(ordinal));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// True while the current stream is being captured into a CUDA graph: code that must not run during a
// capture (host synchronization, polling, allocation) checks this and raises instead.
bool current_stream_capturing();

}  // namespace pmap::detail
