// Internal to the CPU kernels: the table of one ISA variant's ops, the only thing a variant exports
// (extern "C" pmapcc_cpu_ops_<variant>()), and what kernels/cpu_dispatch.cpp forwards ops.h's calls to.
// No Eigen here: the dispatcher is compiled once, for the baseline ISA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"

namespace pmap::kernels::cpu {

struct OpsTable {
  const char* isa;  // "generic" or "avx2"
  std::size_t (*conv2d_workspace_bytes)(const Conv2dParams&);
  void (*conv2d_forward)(Conv2dParams, const float*, const float*, const float*, float*, void*);
  void (*conv2d_backward)(Conv2dParams, const float*, const float*, const float*, float*, float*, float*, void*);
  void (*avg_pool_forward)(AvgPoolParams, const float*, float*);
  void (*avg_pool_backward)(AvgPoolParams, const float*, float*);
  void (*avg_pool_relu_backward)(AvgPoolParams, const float*, const float*, float*);
  std::size_t (*dense_workspace_bytes)(const DenseParams&);
  void (*dense_forward)(DenseParams, const float*, const float*, const float*, float*, void*);
  void (*dense_backward)(DenseParams, const float*, const float*, const float*, float*, float*, float*, void*);
  void (*relu_forward)(std::size_t, const float*, float*);
  void (*relu_backward)(std::size_t, const float*, const float*, float*);
  void (*softmax_cross_entropy)(SoftmaxXentParams, const float*, const std::int32_t*, float*, float*, float*,
                                std::int32_t*);
  void (*sgd_momentum_update)(SgdParams, std::size_t, float*, float*, const float*);
  void (*reduce_sum)(int, std::size_t, const float*, float*);
  void (*reduce_mean)(int, std::size_t, const float*, float*);
  std::size_t (*matmul_workspace_bytes)(const MatmulParams&);
  void (*matmul)(MatmulParams, const float*, const float*, float*, void*);
};

}  // namespace pmap::kernels::cpu

// Each built variant defines its entry point (kernels/cpu/ops_table.cpp compiled as that variant).
extern "C" const pmap::kernels::cpu::OpsTable* pmapcc_cpu_ops_generic();
extern "C" const pmap::kernels::cpu::OpsTable* pmapcc_cpu_ops_avx2();
