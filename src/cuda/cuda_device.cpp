// CUDA backend: device discovery, memory, copies, streams and events. No GPU (no NVIDIA driver loaded,
// or no device) counts as zero GPUs; a GPU that is present but unusable (a driver too old for this
// runtime, ...) also counts as zero, with the reason kept for the errors and tests that need it. Blocking
// copies and fills go to the calling thread's current stream and wait for it, so they are ordered after
// the kernels that thread queued (its stream does not synchronize with the legacy stream).
#include <cuda_runtime_api.h>

#include <filesystem>

#include <pmap/detail/cuda_check.h>
#include <pmap/detail/cuda_stream.h>
#include <pmap/device.h>

#include "availability.h"
#include "cuda_seam.h"

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

cudaStream_t exchange_current_stream_checked(cudaStream_t stream) {
  int ordinal = -1;
  if (stream != nullptr) PMAPCC_CUDA_CHECK(cudaStreamGetDevice(stream, &ordinal));
  const cudaStream_t previous = tls_stream.stream;
  tls_stream = ThreadStream{stream, ordinal};
  return previous;
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

namespace {

// An NVIDIA kernel driver is loaded (a GPU is present) even if the CUDA runtime cannot use it.
bool nvidia_driver_loaded() {
  std::error_code ec;
  return std::filesystem::exists("/proc/driver/nvidia/version", ec) || std::filesystem::exists("/dev/nvidia0", ec);
}

GpuProbe probe() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess) return GpuProbe{n, {}};
  cudaGetLastError();  // clear the sticky "insufficient driver" / "no device" error
  if (err == cudaErrorNoDevice || !nvidia_driver_loaded()) return GpuProbe{0, {}};
  return GpuProbe{0, std::string("an NVIDIA driver is loaded, but the CUDA runtime cannot use the GPU: "
                                 "cudaGetDeviceCount failed with ") +
                         cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")"};
}

}  // namespace

const GpuProbe& cuda_probe() {
  static const GpuProbe result = probe();
  return result;
}

int cuda_device_count() { return cuda_probe().count; }

std::vector<std::string> cuda_report() noexcept {
  std::vector<std::string> out;
  try {
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    cudaGetLastError();
    out.push_back("CUDA driver " + (driver == 0 ? std::string("none") : version(driver)) + ", runtime " +
                  version(runtime));
    const GpuProbe& probe = cuda_probe();
    if (!probe.problem.empty()) out.push_back("GPU unusable: " + probe.problem);
    for (int d = 0; d < probe.count; ++d) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
        cudaGetLastError();
        continue;
      }
      out.push_back("GPU " + std::to_string(d) + ": " + prop.name + ", sm_" + std::to_string(prop.major) +
                    std::to_string(prop.minor) + ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB, " +
                    std::to_string(prop.multiProcessorCount) + " SMs, uuid " + cuda_gpu_uuid(d));
    }
  } catch (...) {  // string allocation only; report what we have
  }
  return out;
}

void* cuda_host_alloc(std::size_t bytes) {
  void* p = nullptr;
  PMAPCC_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return p;
}

void cuda_host_free(void* ptr) noexcept {
  if (ptr != nullptr) cudaFreeHost(ptr);
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
  if (!dst_device.is_cpu() && !src_device.is_cpu() && dst_device.ordinal != src_device.ordinal) {
    // The calling thread may still be writing the source (or reading the destination) on its own stream,
    // which may live on either GPU: wait for it before the copy, which runs on the destination GPU.
    PMAPCC_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
    DeviceScope scope(active.ordinal);
    const cudaStream_t stream = stream_for_gpu(active.ordinal);
    PMAPCC_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.ordinal, src, src_device.ordinal, bytes, stream));
    PMAPCC_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  DeviceScope scope(active.ordinal);
  const cudaStream_t stream = stream_for_gpu(active.ordinal);
  {
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

void cuda_set_thread_stream(StreamHandle stream) {
  exchange_current_stream_checked(static_cast<cudaStream_t>(stream));
}

StreamHandle cuda_thread_stream() noexcept { return current_stream(); }

void cuda_sync_current_stream() { PMAPCC_CUDA_CHECK(cudaStreamSynchronize(current_stream())); }

void cuda_drain_current_stream() noexcept {
  if (cudaStreamSynchronize(current_stream()) != cudaSuccess) cudaGetLastError();
}

EventHandle cuda_event_create(int ordinal) {
  DeviceScope scope(ordinal);
  cudaEvent_t event = nullptr;
  PMAPCC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void cuda_event_destroy(int ordinal, EventHandle event) noexcept {
  int previous = 0;
  if (event == nullptr || cudaGetDevice(&previous) != cudaSuccess) return;
  if (cudaSetDevice(ordinal) == cudaSuccess) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  cudaSetDevice(previous);
}

void cuda_event_record(EventHandle event, StreamHandle stream) {
  PMAPCC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

void cuda_stream_wait_event(StreamHandle stream, EventHandle event) {
  PMAPCC_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

void cuda_event_synchronize(EventHandle event) {
  PMAPCC_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

void cuda_copy_blocks(int ordinal, void* dst, const void* src, std::size_t n, std::size_t outer,
                      std::size_t block_bytes) {
  if (n == 0 || outer == 0 || block_bytes == 0) return;
  DeviceScope scope(ordinal);
  const cudaStream_t stream = stream_for_gpu(ordinal);
  for (std::size_t r = 0; r < n; ++r)  // source block row r lands in column r of every destination row
    PMAPCC_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst) + r * block_bytes, n * block_bytes,
                                        static_cast<const char*>(src) + r * outer * block_bytes, block_bytes,
                                        block_bytes, outer, cudaMemcpyDeviceToDevice, stream));
}

void cuda_copy_rows(int ordinal, void* dst, const void* src, std::size_t src_pitch, std::size_t width,
                    std::size_t rows) {
  if (rows == 0 || width == 0) return;
  DeviceScope scope(ordinal);
  PMAPCC_CUDA_CHECK(cudaMemcpy2DAsync(dst, width, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                      stream_for_gpu(ordinal)));
}

void cuda_copy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream, int ordinal) {
  if (bytes == 0) return;
  DeviceScope scope(ordinal);
  PMAPCC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

}  // namespace pmap::detail
