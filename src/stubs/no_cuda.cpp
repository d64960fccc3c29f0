// Stub CUDA backend for builds without the CUDA toolkit: no CUDA devices exist.
#include <pmap/device.h>
#include <pmap/error.h>

#include "backend.h"

namespace pmap::detail {
namespace {
[[noreturn]] void unavailable() { throw NotAvailable("this pmapcc was built without CUDA (PMAPCC_WITH_CUDA=OFF)"); }
}  // namespace

int cuda_device_count() { return 0; }
void* cuda_alloc(int, std::size_t) { unavailable(); }
void cuda_free(int, void*) noexcept {}
void cuda_memset_zero(int, void*, std::size_t) { unavailable(); }
void cuda_copy(void*, const Device&, const void*, const Device&, std::size_t) { unavailable(); }
void cuda_bind_thread(int) { unavailable(); }

}  // namespace pmap::detail
