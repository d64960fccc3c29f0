// The runtime's seam to CUDA: device memory and copies, streams and events, and the runtime's own device
// work (division, sampling). src/cuda/* implements it; src/stubs/no_cuda.cpp throws NotAvailable in
// builds without CUDA. CUDA-free: streams and events are opaque handles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <pmap/dtype.h>
#include <pmap/random.h>

namespace pmap {
struct Device;
}

namespace pmap::detail {

// CUDA memory and copies; the stub (no CUDA) throws NotAvailable. Blocking: copies and fills run on the
// calling thread's current stream (see pmap/detail/cuda_stream.h), which they then synchronize, so they
// are ordered after the device work the thread has queued.
void* cuda_alloc(int ordinal, std::size_t bytes);
void cuda_free(int ordinal, void* ptr) noexcept;
void cuda_memset_zero(int ordinal, void* ptr, std::size_t bytes);
// Copies bytes between any two devices where at least one is a CUDA device.
void cuda_copy(void* dst, const Device& dst_device, const void* src, const Device& src_device, std::size_t bytes);
// Makes `ordinal` the calling thread's current GPU (worker threads call this once).
void cuda_bind_thread(int ordinal);
// Pinned (page-locked) host memory, which GPUs copy asynchronously (Array::pinned).
void* cuda_host_alloc(std::size_t bytes);
void cuda_host_free(void* ptr) noexcept;

// GPU `ordinal`'s UUID as 32 hex digits (the same GPU reads the same in every process, whatever its
// ordinal there); "" when it cannot be read (no GPU, no driver, no CUDA build). Never throws.
std::string cuda_gpu_uuid(int ordinal) noexcept;

// Lets every GPU in `ordinals` read and write every other's memory (peer access over NVLink / PCIe);
// false, changing nothing that matters, when some pair cannot. Idempotent.
bool cuda_enable_peer_access(const std::vector<int>& ordinals);

// ---- Streams (opaque cudaStream_t) ------------------------------------------------------------------

using StreamHandle = void*;
// A new stream on GPU `ordinal` that does not synchronize with the legacy default stream.
StreamHandle cuda_stream_create(int ordinal);
void cuda_stream_destroy(int ordinal, StreamHandle stream) noexcept;
// Makes `stream` the calling thread's current stream (nullptr: the legacy default stream). Raises CudaError,
// leaving the current stream as it was, when the stream's GPU cannot be queried: work would otherwise
// silently go to the legacy stream (review L3).
void cuda_set_thread_stream(StreamHandle stream);
// The calling thread's current stream (what cuda_set_thread_stream set; nullptr: the legacy stream).
StreamHandle cuda_thread_stream() noexcept;
// Blocks until the calling thread's current stream has finished its work; raises CudaError for a
// failure of that work.
void cuda_sync_current_stream();
// pmax/pmin over NCCL (src/device_kernels.h's order keys, review F2): `count` f32 or f64 of `src` as order
// keys (i32 / i64) into `dst` (which may be src), NaN the largest (max) or smallest (min); and back, in place.
// Queued on `stream`, on the calling thread's GPU.
void cuda_to_order_keys(void* dst, const void* src, std::size_t count, DType dtype, bool nan_wins_max,
                        StreamHandle stream);
void cuda_from_order_keys(void* buffer, std::size_t count, DType dtype, StreamHandle stream);
// The same on a failure path: waits for the stream's work and swallows its error (the caller is already
// raising), so that nothing still runs on arrays after pmap has returned (review L6).
void cuda_drain_current_stream() noexcept;

// Events (opaque cudaEvent_t, timing off) order work between streams without the host (Feed).
using EventHandle = void*;
EventHandle cuda_event_create(int ordinal);
void cuda_event_destroy(int ordinal, EventHandle event) noexcept;
void cuda_event_record(EventHandle event, StreamHandle stream);      // marks the stream's work so far
void cuda_stream_wait_event(StreamHandle stream, EventHandle event);  // later work on stream waits for it
void cuda_event_synchronize(EventHandle event);                      // the host waits for it
// Queues a copy of `bytes` on `stream` of GPU `ordinal` (between its memory and pinned host memory, or
// within it); returns at once.
void cuda_copy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream, int ordinal);

// A mesh device's stream: created for CUDA devices, empty for CPU devices. Move-only.
class DeviceStream {
 public:
  DeviceStream() = default;
  DeviceStream(bool cuda, int ordinal) : ordinal_(ordinal), stream_(cuda ? cuda_stream_create(ordinal) : nullptr) {}
  DeviceStream(DeviceStream&& o) noexcept : ordinal_(o.ordinal_), stream_(o.stream_) { o.stream_ = nullptr; }
  DeviceStream& operator=(DeviceStream&&) = delete;
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  ~DeviceStream() {
    if (stream_ != nullptr) cuda_stream_destroy(ordinal_, stream_);
  }
  StreamHandle get() const { return stream_; }

 private:
  int ordinal_ = 0;
  StreamHandle stream_ = nullptr;
};

// ---- Device-side helpers of the runtime -----------------------------------------------------------

// x[i] /= n for `count` elements of a floating dtype in device memory of GPU `ordinal`, on the calling
// thread's stream there (n as the dtype: the same rounding as the host's division). Asynchronous.
void cuda_divide(int ordinal, void* x, std::size_t count, DType dtype, double n);
// x[i] *= w, likewise.
void cuda_multiply(int ordinal, void* x, std::size_t count, DType dtype, double w);

// dst (outer, n, block) = src (n, outer, block), blocks of block_bytes each, in device memory of GPU
// `ordinal` (not overlapping): an all_gather's stacked result laid out along an inner axis. On the calling
// thread's stream there (one 2-D copy per source block row); asynchronous.
void cuda_copy_blocks(int ordinal, void* dst, const void* src, std::size_t n, std::size_t outer,
                      std::size_t block_bytes);

// dst (rows, width bytes) = `rows` rows of `width` bytes that start `src_pitch` bytes apart at src, in device
// memory of GPU `ordinal` (not overlapping): every n-th chunk of a row-major array (all_to_all's own chunks).
// One 2-D copy on the calling thread's stream there (as cuda_copy_blocks); asynchronous.
void cuda_copy_rows(int ordinal, void* dst, const void* src, std::size_t src_pitch, std::size_t width,
                    std::size_t rows);

// The samplers of pmap/random.h drawn by a kernel into device memory on the current stream; blocking.
enum class SampleKind : std::uint8_t { bits, uniform, normal, truncated_normal, bernoulli };
struct SampleRequest {
  SampleKind kind = SampleKind::bits;
  Key key;
  float a = 0.0f, b = 1.0f;  // (lo, hi), (mean, stddev), (lower, upper), (p, -)
  void* out = nullptr;       // u32, f32, f32, f32 or u8 elements
  std::size_t count = 0;
  int ordinal = 0;           // the GPU holding `out`
};
void cuda_sample(const SampleRequest& request);

}  // namespace pmap::detail
