// The GPU-only part of the CUDA backend, behind a CUDA-free interface (kernels/cuda/exec.h calls it for
// Exec::gpu()): cuBLAS, copies and fills on the current stream, per-stream scratch memory and CUDA-graph
// capture. kernels/cuda/gpu/*.cu in CUDA builds; kernels/stubs/no_cuda.cpp throws NotAvailable otherwise.
// Together with the launch in pmap/detail/launch_gpu.cuh, this is what only a GPU can check.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include <pmapcc/kernels/cuda/exec.h>

namespace pmap::kernels::gpu::native {

bool built();
std::string cublas_version();                               // "" in the stub                                               // false in the stub (no CUDA in this build)
void sgemm(const ColumnMajorGemm& g);                       // cublasSgemmStridedBatched, current stream
void gemm_bf16(const ColumnMajorGemm& g);                   // cublasGemmStridedBatchedEx, bf16 a16/b16
void fill_zero(void* dst, std::size_t bytes);               // cudaMemsetAsync, current stream
void copy(void* dst, const void* src, std::size_t bytes);   // cudaMemcpyAsync, current stream
void* scratch(std::size_t bytes);                           // per (thread, stream); see Exec::scratch
void prepare();                                             // the cuBLAS handle of (thread, stream)
std::unique_ptr<Graph> capture(const std::function<void()>& body);  // a CUDA graph of the current stream

}  // namespace pmap::kernels::gpu::native
