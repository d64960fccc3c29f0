// The CUDA implementation of the ops of kernels/ops.h (pmap::kernels::gpu): the same shapes, layouts and
// semantics as the CPU oracle (pmap::kernels::cpu), on device pointers. Every op is asynchronous: it
// queues kernels and cuBLAS calls on the calling thread's current stream (pmap/detail/cuda_stream.h) on
// its current GPU, and allocates nothing, so a sequence of ops can be captured in a CUDA graph (see
// kernels/cuda/graph.h). Bad parameters and null pointers throw pmap::ValueError before anything is queued.
// Results agree with the CPU ops to ~1e-6 relative (cuBLAS sums in another order); the element-wise ops
// (relu, avg_pool, SGD) are bitwise equal, being compiled without FMA contraction (-fmad=false).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace pmap::kernels::gpu {

// ---- conv2d (im2col + cuBLAS) ---------------------------------------------------------------------------

// Device bytes of workspace conv2d_forward / conv2d_backward need (one buffer serves both): the patch
// matrices of the whole batch, (shared_input ? 1 : M) x N*OH*OW x KH*KW*Cin floats, twice for the
// backward, and the bias-gradient partial sums. Contents need not be initialised.
std::size_t conv2d_workspace_bytes(const Conv2dParams& p);

// As cpu::conv2d_forward; workspace must be conv2d_workspace_bytes(p) bytes of device memory (required).
// Members are one strided-batched GEMM; a shared input is im2col'ed once and read by every member.
void conv2d_forward(const Conv2dParams& p, const float* x, const float* w, const float* b, float* y,
                    void* workspace);

// As cpu::conv2d_backward (dx of a shared input summed over members, in member order).
void conv2d_backward(const Conv2dParams& p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, void* workspace);

// ---- avg_pool -------------------------------------------------------------------------------------------

void avg_pool_forward(const AvgPoolParams& p, const float* x, float* y);
void avg_pool_backward(const AvgPoolParams& p, const float* dy, float* dx);

// ---- dense (cuBLAS) -------------------------------------------------------------------------------------

// Device bytes of workspace dense_forward / dense_backward can use: the bias-gradient partial sums of tall
// batches (0 for up to 1024 rows). A null workspace is always allowed: db is then summed in one pass.
std::size_t dense_workspace_bytes(const DenseParams& p);
void dense_forward(const DenseParams& p, const float* x, const float* w, const float* b, float* y,
                   void* workspace = nullptr);
void dense_backward(const DenseParams& p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, void* workspace = nullptr);

// ---- relu -----------------------------------------------------------------------------------------------

void relu_forward(std::size_t n, const float* x, float* y);
void relu_backward(std::size_t n, const float* y, const float* dy, float* dx);

// ---- softmax cross-entropy ------------------------------------------------------------------------------

// As cpu::softmax_cross_entropy, with every pointer in device memory: loss (M) f32 and correct (M) i32
// are written on the device. Labels outside [0, K) cannot raise from a kernel: the row is skipped (its
// loss counts 0, its dlogits row is zero) and the number of such rows is added to *bad_labels (device
// i32, optional; the caller zeroes it and checks it after synchronizing).
void softmax_cross_entropy(const SoftmaxXentParams& p, const float* logits, const std::int32_t* labels, float* loss,
                           float* dlogits, float* probs, std::int32_t* correct, std::int32_t* bad_labels);

// ---- optimizer ------------------------------------------------------------------------------------------

void sgd_momentum_update(const SgdParams& p, std::size_t n, float* params, float* momentum, const float* grads);

// ---- reductions (Thrust) --------------------------------------------------------------------------------

// out[m] = sum of x[m * n .. m * n + n) (device x, device out), accumulated in double. out (M).
void reduce_sum(int members, std::size_t n, const float* x, float* out);
// out[m] = reduce_sum / n. n must be > 0.
void reduce_mean(int members, std::size_t n, const float* x, float* out);

}  // namespace pmap::kernels::gpu
