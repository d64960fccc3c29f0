// pmapcc's CPU stand-in for the CUDA runtime and cuBLAS (test-only; built with PMAPCC_CUDA_STANDIN=ON, the
// cuda-standin presets). It implements the functions pmapcc calls, with the real toolkit's headers, over
// N fake GPUs (PMAPCC_STANDIN_GPUS, default 1): every stream is a host thread running its work in order,
// device memory is mapped per allocation and quarantined (no access) when freed, graph capture records
// the captured stream's work and refuses what CUDA refuses. What it adds to CUDA's API is here: the
// kernel-launch seam (pmap/detail/launch_gpu.cuh calls launch() instead of <<<>>>), fault injection, and
// the queries the stand-in's own tests use. See tests/standin/README.md for the rules it keeps.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace pmapcc_standin {

// Queues `body` (a kernel run over its grid on the host) on `stream` as a kernel launch: the stream must
// belong to the current device (else cudaErrorInvalidResourceHandle, as a launch into another GPU's
// stream). The result is also the thread's last error, as a real launch's is.
cudaError_t launch(cudaStream_t stream, std::function<void()> body);

// Makes the next `times` calls of the runtime or cuBLAS function `api` (e.g. "cudaSetDevice") fail
// with `error` (a cudaError_t, or a cublasStatus_t for cuBLAS functions), after `skip` calls succeed.
// PMAPCC_STANDIN_FAIL="api=error[@skip][xtimes],..." (error as a number) does the same for a whole run.
void inject_fault(const char* api, int error, int times = 1, int skip = 0);
void clear_faults();

// How many kernel launches and graph launches have been queued to run (not recorded into a capture) since
// the process started, on every fake GPU: a replayed step's count of each, for tests.
std::uint64_t kernel_launches();
std::uint64_t graph_launches();

// How many bytes of freed device memory are quarantined (mapped with no access) right now.
std::size_t quarantined_bytes();

// How many NCCL communicators exist right now (made, and neither destroyed nor aborted).
std::size_t live_nccl_communicators();

}  // namespace pmapcc_standin
