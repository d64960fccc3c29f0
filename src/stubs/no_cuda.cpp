// Stub CUDA backend for builds without the CUDA toolkit: no CUDA devices exist.
// A call that needs a device or a stream raises NotAvailable.
// A call that releases, waits for, drains or resets one has nothing to do and returns.
#include <pmap/device.h>
#include <pmap/error.h>

#include "availability.h"
#include "cuda_seam.h"
#include "thread_hub.h"

namespace pmap::detail {
namespace {
[[noreturn]] void unavailable() { throw NotAvailable("this pmapcc was built without CUDA (PMAPCC_WITH_CUDA=OFF)"); }
}  // namespace

const GpuProbe& cuda_probe() {
  static const GpuProbe none{};
  return none;
}
int cuda_device_count() { return 0; }
std::vector<std::string> cuda_report() noexcept { return {}; }
void* cuda_host_alloc(std::size_t) { unavailable(); }
void cuda_host_free(void*) noexcept {}
EventHandle cuda_event_create(int) { unavailable(); }
void cuda_event_destroy(int, EventHandle) noexcept {}
void cuda_event_record(EventHandle, StreamHandle) { unavailable(); }
void cuda_stream_wait_event(StreamHandle, EventHandle) { unavailable(); }
void cuda_event_synchronize(EventHandle) { unavailable(); }
void cuda_copy_async(void*, const void*, std::size_t, StreamHandle, int) { unavailable(); }
void* cuda_alloc(int, std::size_t) { unavailable(); }
void cuda_free(int, void*) noexcept {}
void cuda_memset_zero(int, void*, std::size_t) { unavailable(); }
void cuda_copy(void*, const Device&, const void*, const Device&, std::size_t) { unavailable(); }
void cuda_bind_thread(int) { unavailable(); }
std::string cuda_gpu_uuid(int) noexcept { return {}; }
bool cuda_enable_peer_access(const std::vector<int>&) { return false; }
StreamHandle cuda_stream_create(int) { unavailable(); }
void cuda_stream_destroy(int, StreamHandle) noexcept {}
void cuda_set_thread_stream(StreamHandle) {}
StreamHandle cuda_thread_stream() noexcept { return nullptr; }
void cuda_sync_current_stream() {}
void cuda_drain_current_stream() noexcept {}
void cuda_divide(int, void*, std::size_t, DType, double) { unavailable(); }
void cuda_multiply(int, void*, std::size_t, DType, double) { unavailable(); }
void cuda_to_order_keys(void*, const void*, std::size_t, DType, bool, StreamHandle) { unavailable(); }
void cuda_from_order_keys(void*, std::size_t, DType, StreamHandle) { unavailable(); }
void cuda_copy_blocks(int, void*, const void*, std::size_t, std::size_t, std::size_t) { unavailable(); }
void cuda_copy_rows(int, void*, const void*, std::size_t, std::size_t, std::size_t) { unavailable(); }
void cuda_sample(const SampleRequest&) { unavailable(); }
void device_execute(const CollectiveOp&, const std::vector<const void*>&, const std::vector<void*>&, int, bool) {
  unavailable();
}

}  // namespace pmap::detail
