// What this build of pmapcc was compiled with, and how many GPUs this process can use.
#pragma once

#include <string>
#include <vector>

namespace pmap {

struct BuildInfo {
  bool cuda = false;  // the CUDA backend was compiled in
  bool nccl = false;  // NCCL collectives were compiled in
  bool mpi = false;   // the MPI multi-process backend was compiled in
};

BuildInfo build_info();

// Usable CUDA GPUs; 0 without a CUDA build, without a driver, or without a GPU (never throws).
int cuda_device_count();

// What this process knows of its GPUs: `count` usable ones; when there are none, `problem` tells "no GPU"
// ("": no NVIDIA driver loaded, no device, or a build without CUDA) from "a GPU is here but CUDA cannot
// use it" (the reason, with the CUDA runtime's error, e.g. a driver too old for this runtime).
struct GpuStatus {
  int count = 0;
  std::string problem;
};
GpuStatus cuda_status();

// For logs: the CUDA driver and runtime versions, NCCL's (when built with it), and one line per GPU (name,
// compute capability, memory, UUID). Empty in builds without CUDA. Never throws.
std::vector<std::string> cuda_report();

}  // namespace pmap
