// pmap_info: what this build of pmapcc can use here: its backends, the CPU kernels' ISA, the CUDA stack
// (driver, runtime, cuBLAS, NCCL) and every GPU, or why there is no usable GPU. Exit status 0; with
// --require-gpu, 1 when no GPU is usable (scripts/gpu_checks.sh starts with it).
#include <cstdio>
#include <cstring>

#include <pmap/backends.h>
#include <pmap/device.h>

#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cpu_backend.h>

int main(int argc, char** argv) {
  const bool require_gpu = argc > 1 && std::strcmp(argv[1], "--require-gpu") == 0;
  const pmap::BuildInfo b = pmap::build_info();
  std::printf("pmapcc build: CUDA %s, NCCL %s, MPI %s; CPU kernels %s; %d CPU device(s) by default\n",
              b.cuda ? "on" : "off", b.nccl ? "on" : "off", b.mpi ? "on" : "off", pmap::kernels::cpu::isa().c_str(),
              pmap::default_cpu_device_count());
  for (const std::string& line : pmap::cuda_report()) std::printf("%s\n", line.c_str());
  const std::string cublas = pmap::kernels::cublas_version();
  if (!cublas.empty()) std::printf("%s\n", cublas.c_str());
  const pmap::GpuStatus gpu = pmap::cuda_status();
  if (gpu.count > 0) {
    std::printf("usable GPUs: %d\n", gpu.count);
    return 0;
  }
  std::printf("usable GPUs: 0 (%s)\n", gpu.problem.empty() ? "no GPU here" : gpu.problem.c_str());
  return require_gpu ? 1 : 0;
}
