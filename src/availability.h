// Which optional backends this process can use (CUDA GPUs, NCCL, MPI), and facts about them for logs.
// Implemented by the backends' file pairs chosen by CMake: src/cuda/* or src/stubs/no_cuda.cpp, and so on.
#pragma once

#include <string>
#include <vector>

namespace pmap::detail {

// Number of CUDA GPUs usable by this process; 0 when the build has no CUDA, there is no GPU, or a GPU
// cannot be used (see cuda_probe). Never throws; probes once per process.
int cuda_device_count();
// The probe behind cuda_device_count: `problem` is "" when GPUs are usable or when there is simply no
// GPU (no NVIDIA driver loaded, no device); otherwise it says why a GPU that is present cannot be used
// (for instance a driver too old for this CUDA runtime), with the runtime's own error. Never throws.
struct GpuProbe {
  int count = 0;
  std::string problem;
};
const GpuProbe& cuda_probe();
// Facts about the CUDA stack for logs: driver and runtime versions, then one line per GPU (name, compute
// capability, memory, UUID). Empty without CUDA. Never throws.
std::vector<std::string> cuda_report() noexcept;
bool nccl_available();
std::string nccl_version();  // "2.28.3" (the library loaded), or "" without NCCL. Never throws.
bool mpi_available();

}  // namespace pmap::detail
