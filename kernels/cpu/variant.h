// Internal to the CPU kernels: kernels/cpu/*.cpp are compiled once per ISA variant (generic: the baseline
// ISA; avx2: -mavx2 -mfma), each into its own namespace pmap::kernels::cpu::<variant> (PMAPCC_CPU_NS), so
// the two builds share no symbol. This header declares one variant's ops: ops.h's contracts, same names.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

#ifndef PMAPCC_CPU_VARIANT
#error "kernels/cpu sources are built per ISA variant: compile them with -DPMAPCC_CPU_VARIANT=generic|avx2"
#endif
#define PMAPCC_CPU_NS pmap::kernels::cpu::PMAPCC_CPU_VARIANT

namespace PMAPCC_CPU_NS {

std::size_t conv2d_workspace_bytes(const Conv2dParams& p);
void conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y, void* workspace);
void conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* db, void* workspace);
void avg_pool_forward(AvgPoolParams p, const float* x, float* y);
void avg_pool_backward(AvgPoolParams p, const float* dy, float* dx);
void avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx);
std::size_t dense_workspace_bytes(const DenseParams& p);
void dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y, void* workspace);
void dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, void* workspace);
void relu_forward(std::size_t n, const float* x, float* y);
void relu_backward(std::size_t n, const float* y, const float* dy, float* dx);
void softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels, float* loss,
                           float* dlogits, float* probs, std::int32_t* correct);
void sgd_momentum_update(SgdParams p, std::size_t n, float* params, float* momentum, const float* grads);
void reduce_sum(int members, std::size_t n, const float* x, float* out);
void reduce_mean(int members, std::size_t n, const float* x, float* out);
std::size_t matmul_workspace_bytes(const MatmulParams& p);
void matmul(MatmulParams p, const float* a, const float* b, float* c, void* workspace);

}  // namespace PMAPCC_CPU_NS
