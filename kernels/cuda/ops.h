// The CUDA implementation of the ops of kernels/ops.h (pmap::kernels::gpu): the same shapes, layouts and
// semantics as the CPU oracle (pmap::kernels::cpu), on the memory of the Exec's target. With Exec::gpu()
// every op is asynchronous: it queues kernels and GEMMs on the calling thread's current stream on its
// current GPU and allocates nothing (given workspaces), so a sequence of ops can be captured in a CUDA
// graph. With Exec::host() the same kernels run on the host over their whole launch grid (host memory).
// Bad parameters and null pointers throw pmap::ValueError before anything is queued. Results agree with
// the CPU ops to ~1e-6 relative on a GPU (cuBLAS sums in another order); the element-wise ops (relu,
// avg_pool, SGD, the ensemble reductions) and the loss rows are bitwise equal, being compiled without FMA
// contraction (-fmad=false) and computed in the CPU's order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <pmap/error.h>

#include "kernels/cuda/exec.h"
#include "kernels/ops.h"

namespace pmap::kernels::gpu {

// Throws pmap::ValueError "<op>: <arg> is null" when ptr is null.
inline void require(const void* ptr, const char* op, const char* arg) {
  if (ptr == nullptr) throw ValueError(std::string(op) + ": " + arg + " is null");
}

// ---- conv2d (im2col + GEMM) -----------------------------------------------------------------------------

// Bytes of workspace conv2d_forward / conv2d_backward need (one buffer serves both): the patch matrices of
// the whole batch, (shared_input ? 1 : M) x N*OH*OW x KH*KW*Cin floats, twice for the backward, and the
// bias-gradient partial sums. Contents need not be initialised.
std::size_t conv2d_workspace_bytes(const Conv2dParams& p);

// As cpu::conv2d_forward (bias and fused ReLU in one epilogue pass). workspace: conv2d_workspace_bytes(p)
// bytes, or null (Exec::scratch, which allocates when it grows). Members are one strided-batched GEMM; a
// shared input is im2col'ed once and read by every member.
void conv2d_forward(const Exec& ex, const Conv2dParams& p, const float* x, const float* w, const float* b, float* y,
                    void* workspace);

// As cpu::conv2d_backward (dx of a shared input summed over members, in member order).
void conv2d_backward(const Exec& ex, const Conv2dParams& p, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* db, void* workspace);

// ---- avg_pool -------------------------------------------------------------------------------------------

void avg_pool_forward(const Exec& ex, const AvgPoolParams& p, const float* x, float* y);
void avg_pool_backward(const Exec& ex, const AvgPoolParams& p, const float* dy, float* dx);
// As cpu::avg_pool_relu_backward (dx may be r).
void avg_pool_relu_backward(const Exec& ex, const AvgPoolParams& p, const float* r, const float* dy, float* dx);

// ---- dense (GEMM) ---------------------------------------------------------------------------------------

// Bytes of workspace dense_forward / dense_backward can use: the bias-gradient partial sums of tall
// batches (0 for up to 256 rows). A null workspace is always allowed: db is then summed in one pass.
std::size_t dense_workspace_bytes(const DenseParams& p);
void dense_forward(const Exec& ex, const DenseParams& p, const float* x, const float* w, const float* b, float* y,
                   void* workspace = nullptr);
void dense_backward(const Exec& ex, const DenseParams& p, const float* x, const float* w, const float* dy, float* dx,
                    float* dw, float* db, void* workspace = nullptr);

// ---- relu -----------------------------------------------------------------------------------------------

void relu_forward(const Exec& ex, std::size_t n, const float* x, float* y);
void relu_backward(const Exec& ex, std::size_t n, const float* y, const float* dy, float* dx);

// ---- softmax cross-entropy ------------------------------------------------------------------------------

// Bytes of workspace softmax_cross_entropy needs: a loss term and a hit flag per row.
std::size_t softmax_cross_entropy_workspace_bytes(const SoftmaxXentParams& p);

// As cpu::softmax_cross_entropy, every pointer in the target's memory: loss (M) f32 and correct (M) i32
// are written there. Labels outside [0, K) cannot raise from a kernel: such a row is skipped (its loss
// term is 0, its dlogits row zero) and counted into *bad_labels (i32, optional, added to: the caller
// zeroes it and reads it later); with shared labels a bad label counts once, not once per member.
// workspace: softmax_cross_entropy_workspace_bytes(p) bytes, or null (Exec::scratch).
void softmax_cross_entropy(const Exec& ex, const SoftmaxXentParams& p, const float* logits,
                           const std::int32_t* labels, float* loss, float* dlogits, float* probs,
                           std::int32_t* correct, std::int32_t* bad_labels, void* workspace);

// ---- optimizer ------------------------------------------------------------------------------------------

void sgd_momentum_update(const Exec& ex, const SgdParams& p, std::size_t n, float* params, float* momentum,
                         const float* grads);

// ---- reductions -----------------------------------------------------------------------------------------

// out[m] = sum of x[m * n .. m * n + n), accumulated in double in index order. out (M).
void reduce_sum(const Exec& ex, int members, std::size_t n, const float* x, float* out);
// out[m] = reduce_sum / n. n must be > 0.
void reduce_mean(const Exec& ex, int members, std::size_t n, const float* x, float* out);

// The ensemble step's reductions: as cpu::sum_members, cpu::divide, cpu::argmax_hits,
// cpu::accumulate_metrics and cpu::mean_from_sums (kernels/ops.h).
void sum_members(const Exec& ex, int count, std::size_t n, const float* x, float* out, bool accumulate);
void divide(const Exec& ex, std::size_t n, float* x, float divisor);
void argmax_hits(const Exec& ex, int rows, int classes, const float* scores, const std::int32_t* labels,
                 std::int32_t* hits);
void accumulate_metrics(const Exec& ex, int count, const float* loss, const std::int32_t* correct, double rows,
                        double* loss_sum, std::int32_t* hits);
void mean_from_sums(const Exec& ex, int count, const double* sums, double divisor, float* out);

// As cpu::calibration_sums (and the same bits: the rows' arithmetic is kernels/calibration.h, summed in row
// order), except that a row whose label is out of range adds nothing instead of raising (the loss counts
// such labels). workspace:
// calibration_workspace_bytes(p) bytes, or null (Exec::scratch).
std::size_t calibration_workspace_bytes(const CalibrationParams& p);
void calibration_sums(const Exec& ex, const CalibrationParams& p, const float* probs, const std::int32_t* labels,
                      double* sums, void* workspace);
void predictions(const Exec& ex, int rows, int classes, const float* probs, std::int32_t* predicted,
                 float* probability, float* entropy);

}  // namespace pmap::kernels::gpu
