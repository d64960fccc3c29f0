// This variant's table of ops, exported as pmapcc_cpu_ops_<variant>() for kernels/cpu_dispatch.cpp.
#include "kernels/cpu/ops_table.h"

#include "kernels/cpu/variant.h"

#define PMAPCC_CPU_CONCAT2(a, b) a##b
#define PMAPCC_CPU_CONCAT(a, b) PMAPCC_CPU_CONCAT2(a, b)
#define PMAPCC_CPU_STR2(a) #a
#define PMAPCC_CPU_STR(a) PMAPCC_CPU_STR2(a)

extern "C" const pmap::kernels::cpu::OpsTable* PMAPCC_CPU_CONCAT(pmapcc_cpu_ops_, PMAPCC_CPU_VARIANT)() {
  namespace v = PMAPCC_CPU_NS;
  static const pmap::kernels::cpu::OpsTable table{
      PMAPCC_CPU_STR(PMAPCC_CPU_VARIANT), v::conv2d_workspace_bytes, v::conv2d_forward, v::conv2d_backward,
      v::avg_pool_forward, v::avg_pool_backward, v::avg_pool_relu_backward, v::dense_workspace_bytes, v::dense_forward, v::dense_backward,
      v::relu_forward, v::relu_backward, v::softmax_cross_entropy, v::sgd_momentum_update, v::reduce_sum,
      v::reduce_mean, v::matmul_workspace_bytes, v::matmul};
  return &table;
}
