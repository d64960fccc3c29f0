// Internal seams between the runtime and its optional backends (CUDA, NCCL, MPI), implemented by file
// pairs chosen by CMake: src/cuda/* or src/stubs/no_cuda.cpp, and so on.
#pragma once

namespace pmap::detail {

// Number of CUDA GPUs usable by this process; 0 when the build has no CUDA or the driver is missing.
int cuda_device_count();
bool nccl_available();
bool mpi_available();

}  // namespace pmap::detail

#include <cstddef>

namespace pmap {
struct Device;
}

namespace pmap::detail {

// CUDA memory and copies; the stub (no CUDA) throws NotAvailable. Blocking.
void* cuda_alloc(int ordinal, std::size_t bytes);
void cuda_free(int ordinal, void* ptr) noexcept;
void cuda_memset_zero(int ordinal, void* ptr, std::size_t bytes);
// Copies bytes between any two devices where at least one is a CUDA device.
void cuda_copy(void* dst, const Device& dst_device, const void* src, const Device& src_device, std::size_t bytes);
// Makes `ordinal` the calling thread's current GPU (worker threads call this once).
void cuda_bind_thread(int ordinal);

}  // namespace pmap::detail
