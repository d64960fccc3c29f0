// CUDA backend: device discovery, memory, copies and streams. A missing or too-old driver counts as zero
// GPUs. Copies and fills go to the calling thread's current stream and wait for it, so they are ordered
// after the kernels that thread queued (its stream does not synchronize with the legacy stream).
#include <cuda_runtime_api.h>

#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/device.h>

#include "backend.h"

namespace pmap::detail {
namespace {

// The calling thread's stream and the GPU it belongs to (-1: the legacy default stream of any GPU).
struct ThreadStream {
  cudaStream_t stream = nullptr;
  int ordinal = -1;
};
thread_local ThreadStream tls_stream;

}  // namespace

cudaStream_t current_stream() noexcept { return tls_stream.stream; }

cudaStream_t stream_for_gpu(int ordinal) noexcept {
  return tls_stream.ordinal == ordinal ? tls_stream.stream : nullptr;
}

cudaStream_t exchange_current_stream(cudaStream_t stream) noexcept {
  const cudaStream_t previous = tls_stream.stream;
  int ordinal = -1;
  if (stream != nullptr && cudaStreamGetDevice(stream, &ordinal) != cudaSuccess) {
    cudaGetLastError();
    ordinal = -1;
  }
  tls_stream = ThreadStream{stream, ordinal};
  return previous;
}

bool current_stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PMAPCC_CUDA_CHECK(cudaStreamIsCapturing(current_stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "insufficient driver" / "no device" error
    return 0;
  }
  return n;
}

void* cuda_alloc(int ordinal, std::size_t bytes) {
  DeviceScope scope(ordinal);
  void* p = nullptr;
  PMAPCC_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void cuda_free(int ordinal, void* ptr) noexcept {
  if (ptr == nullptr) return;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;  // destructors never throw
  if (cudaSetDevice(ordinal) == cudaSuccess) cudaFree(ptr);
  cudaSetDevice(previous);
}

void cuda_memset_zero(int ordinal, void* ptr, std::size_t bytes) {
  DeviceScope scope(ordinal);
  const cudaStream_t stream = stream_for_gpu(ordinal);
  PMAPCC_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream));
  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void cuda_copy(void* dst, const Device& dst_device, const void* src, const Device& src_device,
               std::size_t bytes) {
  const Device& active = dst_device.is_cpu() ? src_device : dst_device;
  DeviceScope scope(active.ordinal);
  const cudaStream_t stream = stream_for_gpu(active.ordinal);
  if (!dst_device.is_cpu() && !src_device.is_cpu() && dst_device.ordinal != src_device.ordinal) {
    PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));  // the source may still be written by this thread
    PMAPCC_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.ordinal, src, src_device.ordinal, bytes, stream));
  } else {
    PMAPCC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  }
  PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void cuda_bind_thread(int ordinal) { PMAPCC_CUDA_CHECK(cudaSetDevice(ordinal)); }

std::string cuda_gpu_uuid(int ordinal) noexcept {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
    cudaGetLastError();  // clear the error, so that later calls report their own
    return {};
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (char c : prop.uuid.bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

bool cuda_enable_peer_access(const std::vector<int>& ordinals) {
  for (int a : ordinals) {
    for (int b : ordinals) {
      if (a == b) continue;
      int can = 0;
      PMAPCC_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (can == 0) return false;
    }
  }
  for (int a : ordinals) {
    DeviceScope scope(a);
    for (int b : ordinals) {
      if (a == b) continue;
      const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        PMAPCC_CUDA_CHECK(err);
      }
    }
  }
  return true;
}

StreamHandle cuda_stream_create(int ordinal) {
  DeviceScope scope(ordinal);
  cudaStream_t stream = nullptr;
  PMAPCC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

void cuda_stream_destroy(int ordinal, StreamHandle stream) noexcept {
  int previous = 0;
  if (stream == nullptr || cudaGetDevice(&previous) != cudaSuccess) return;
  if (cudaSetDevice(ordinal) == cudaSuccess) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  cudaSetDevice(previous);
}

void cuda_set_thread_stream(StreamHandle stream) noexcept {
  exchange_current_stream(static_cast<cudaStream_t>(stream));
}

void cuda_sync_current_stream() { PMAPCC_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

}  // namespace pmap::detail
