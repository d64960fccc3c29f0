// Internal to the CPU kernels: one ISA variant's backend. kernels/cpu/*.cpp are compiled once per variant
// (generic: the baseline ISA; avx2: -mavx2 -mfma), each into its own namespace pmap::kernels::cpu::<variant>
// (PMAPCC_CPU_NS), so the two builds share no symbol; each defines the Ops members it implements, and the
// variant's one exported symbol is its entry point, extern "C" pmapcc_cpu_backend_<variant>()
// (kernels/cpu/backend.cpp). The contracts are kernels/backend.h's and kernels/cpu_backend.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <pmapcc/kernels/cpu_backend.h>

#ifndef PMAPCC_CPU_VARIANT
#error "kernels/cpu sources are built per ISA variant: compile them with -DPMAPCC_CPU_VARIANT=generic|avx2|avx512"
#endif
#define PMAPCC_CPU_NS pmap::kernels::cpu::PMAPCC_CPU_VARIANT
#define PMAPCC_CPU_STR2(a) #a
#define PMAPCC_CPU_STR(a) PMAPCC_CPU_STR2(a)  // PMAPCC_CPU_STR(PMAPCC_CPU_VARIANT): the variant's name

namespace PMAPCC_CPU_NS {

// optimizer.cpp
class OptimizerOpsImpl final : public OptimizerOps {
 public:
  void schedule_lr(ScheduleParams p, int members, const std::int64_t* step, const float* base_lr,
                   float* lr) const override;
  void adam_step_size(AdamParams p, int members, const std::int64_t* step, const float* lr,
                      float* alpha) const override;
  void sum_squares(int members, std::size_t n, const float* x, double* sumsq, bool accumulate) const override;
  void clip_factor(int members, const double* sumsq, float max_norm, float* factor) const override;
  void sgd_update(SgdParams p, int members, std::size_t n, UpdateScalars s, float* params, float* momentum,
                  const float* grads) const override;
  void sgd_trace(SgdParams p, int members, std::size_t n, const float* lr, const float* grads, const float* trace,
                 float* next, float* updates) const override;
  void adam_update(AdamParams p, int members, std::size_t n, UpdateScalars s, const float* alpha, float* params,
                   float* m, float* v, const float* grads) const override;
  void increment(std::int64_t* step) const override;
};

// layers.cpp
class LayerOpsImpl final : public LayerOps {
 public:
  void batch_norm_sums(BatchNormParams p, const float* x, double* sums) const override;
  void batch_norm_statistics(BatchNormParams p, const double* sums, double count, float* moving_mean,
                             float* moving_variance, float* stats) const override;
  void batch_norm_apply(BatchNormParams p, const float* x, const float* stats, const float* gamma, const float* beta,
                        float* y) const override;
  void batch_norm_backward_sums(BatchNormParams p, const float* x, const float* dy, const float* stats, double* sums,
                                float* dgamma, float* dbeta) const override;
  void batch_norm_backward(BatchNormParams p, const float* x, const float* dy, const float* stats,
                           const double* sums, double count, const float* gamma, float* dx) const override;
  void dropout(DropoutParams p, const std::uint32_t* keys, const std::int64_t* step, const float* x,
               float* y) const override;
  void scale_shift(std::size_t n, const float* x, float scale, float offset, float* y) const override;
  void relu_forward(std::size_t n, const float* x, float* y) const override;  // elementwise.cpp
  void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const override;
};

// conv.cpp, pool.cpp
class ConvOpsImpl final : public ConvOps {
 public:
  std::size_t conv2d_workspace_bytes(Conv2dParams p) const override;
  void conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y,
                      void* workspace) const override;
  void conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, void* workspace) const override;
  void avg_pool_forward(AvgPoolParams p, const float* x, float* y) const override;
  void avg_pool_backward(AvgPoolParams p, const float* dy, float* dx) const override;
  void avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx) const override;
};

// dense.cpp
class DenseOpsImpl final : public DenseOps {
 public:
  std::size_t dense_workspace_bytes(DenseParams p) const override;
  void dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y,
                     void* workspace) const override;
  void dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, void* workspace) const override;
};

// loss.cpp; softmax_cross_entropy's bad_labels and workspace are unused: a bad label raises ValueError.
// The reductions: elementwise.cpp.
class LossOpsImpl final : public LossOps {
 public:
  std::size_t softmax_cross_entropy_workspace_bytes(SoftmaxXentParams p) const override;
  void softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels, float* loss,
                             float* dlogits, float* probs, std::int32_t* correct, std::int32_t* bad_labels,
                             void* workspace) const override;
  void reduce_sum(int members, std::size_t n, const float* x, float* out) const override;
  void reduce_mean(int members, std::size_t n, const float* x, float* out) const override;
};

// elementwise.cpp
class ElementwiseOpsImpl final : public ElementwiseOps {
 public:
  void unary(UnaryOp op, std::size_t n, const float* x, float* y) const override;
  void activation_backward(UnaryOp op, std::size_t n, const float* y, const float* dy, float* dx) const override;
  void binary(BinaryOp op, std::size_t n, const float* a, std::size_t nb, const float* b, float* y) const override;
};

// layout.cpp
class LayoutOpsImpl final : public LayoutOps {
 public:
  void strided_copy(StridedCopyParams p, const float* src, float* dst) const override;
  void strided_reduce(ReduceOp op, StridedReduceParams p, const float* x, float* y) const override;
  void max_pool_forward(MaxPoolParams p, const float* x, float* y) const override;
  void max_pool_backward(MaxPoolParams p, const float* x, const float* dy, float* dx) const override;
};

class Ops final : public CpuBackend {
 public:
  std::string isa() const override;                                   // backend.cpp
  std::size_t matmul_workspace_bytes(MatmulParams p) const override;  // matmul.cpp
  void matmul(MatmulParams p, const float* a, const float* b, float* c, void* workspace) const override;
  const ConvOps& conv() const override { return conv_; }
  const DenseOps& dense() const override { return dense_; }
  const LossOps& loss() const override { return loss_; }
  const OptimizerOps& optimizer() const override { return optimizer_; }
  const LayerOps& layers() const override { return layers_; }
  const ElementwiseOps& elementwise() const override { return elementwise_; }
  const LayoutOps& layout() const override { return layout_; }

 private:
  ConvOpsImpl conv_;
  DenseOpsImpl dense_;
  LossOpsImpl loss_;
  OptimizerOpsImpl optimizer_;
  LayerOpsImpl layers_;
  ElementwiseOpsImpl elementwise_;
  LayoutOpsImpl layout_;
};

}  // namespace PMAPCC_CPU_NS
