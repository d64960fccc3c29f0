// What this build of pmapcc was compiled with, and how many GPUs this process can use.
#pragma once

namespace pmap {

struct BuildInfo {
  bool cuda = false;  // the CUDA backend was compiled in
  bool nccl = false;  // NCCL collectives were compiled in
  bool mpi = false;   // the MPI multi-process backend was compiled in
};

BuildInfo build_info();

// Usable CUDA GPUs; 0 without a CUDA build, without a driver, or without a GPU (never throws).
int cuda_device_count();

}  // namespace pmap
