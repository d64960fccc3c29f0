// The GPU-only part of the CUDA kernels in builds without the CUDA toolkit: every call throws NotAvailable.
// The kernels themselves are still built, as host code, and run on the host (kernels::cuda_backend_on_host).
#include <pmap/error.h>

#include <pmapcc/kernels/cuda/gpu/native.h>

namespace pmap::kernels::gpu::native {
namespace {
[[noreturn]] void unavailable() {
  throw NotAvailable("the CUDA kernels need a GPU build (PMAPCC_WITH_CUDA=OFF or no CUDA toolkit here)");
}
}  // namespace

bool built() { return false; }
std::string cublas_version() { return {}; }
void sgemm(const ColumnMajorGemm&) { unavailable(); }
void gemm_bf16(const ColumnMajorGemm&) { unavailable(); }
void fill_zero(void*, std::size_t) { unavailable(); }
void copy(void*, const void*, std::size_t) { unavailable(); }
void* scratch(std::size_t) { unavailable(); }
void prepare() { unavailable(); }
std::unique_ptr<Graph> capture(const std::function<void()>&) { unavailable(); }

}  // namespace pmap::kernels::gpu::native
