// Internal seams between the runtime and its optional backends (CUDA, NCCL, MPI), implemented by file
// pairs chosen by CMake: src/cuda/* or src/stubs/no_cuda.cpp, and so on.
#pragma once

namespace pmap::detail {

// Number of CUDA GPUs usable by this process; 0 when the build has no CUDA or the driver is missing.
int cuda_device_count();
bool nccl_available();
bool mpi_available();

}  // namespace pmap::detail
