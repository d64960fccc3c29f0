// Internal to the CUDA kernels: the CUDA Backend, on the memory of its Exec's target. With Exec::gpu() every
// op is asynchronous: it queues kernels and GEMMs on the calling thread's current stream on its current GPU
// and allocates nothing (given workspaces), so a sequence of ops can be captured in a CUDA graph. With
// Exec::host() (kernels::cuda_backend_on_host) the same kernels run on the host over their whole launch
// grid, on host memory: how the CUDA code is checked without a GPU. Bad parameters and null pointers throw
// pmap::ValueError before anything is queued. The contracts are kernels/backend.h's; the element-wise ops,
// the ensemble step's reductions and the loss rows give the CPU's bits, being compiled without FMA
// contraction (-fmad=false) and computed in the CPU's order. Each op's body is in the .cu file of its family.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <pmap/error.h>

#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/cuda/exec.h>

namespace pmap::kernels::gpu {

// optimizer.cu: one item per element (per member for the per-member scalars).
class CudaOptimizerOps final : public OptimizerOps {
 public:
  explicit CudaOptimizerOps(Exec ex) : ex_(ex) {}
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

 private:
  Exec ex_;
};

// layers.cu: one item per element, per (member, channel) for the sums and statistics.
class CudaLayerOps final : public LayerOps {
 public:
  explicit CudaLayerOps(Exec ex) : ex_(ex) {}
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
  void relu_forward(std::size_t n, const float* x, float* y) const override;  // elementwise.cu
  void relu_backward(std::size_t n, const float* y, const float* dy, float* dx) const override;

 private:
  Exec ex_;
};

// conv.cu: im2col + one strided-batched GEMM over the members (a shared input im2col'ed once), bias and
// fused ReLU in one epilogue pass; a shared input's dx summed over members in member order. A null
// workspace takes Exec::scratch, which allocates when it grows. pool.cu: one item per output element.
class CudaConvOps final : public ConvOps {
 public:
  explicit CudaConvOps(Exec ex) : ex_(ex) {}
  std::size_t conv2d_workspace_bytes(Conv2dParams p) const override;
  void conv2d_forward(Conv2dParams p, const float* x, const float* w, const float* b, float* y,
                      void* workspace) const override;
  void conv2d_backward(Conv2dParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, void* workspace) const override;
  void avg_pool_forward(AvgPoolParams p, const float* x, float* y) const override;
  void avg_pool_backward(AvgPoolParams p, const float* dy, float* dx) const override;
  void avg_pool_relu_backward(AvgPoolParams p, const float* r, const float* dy, float* dx) const override;

 private:
  Exec ex_;
};

// dense.cu: a null workspace is always allowed (db is then summed in one pass).
class CudaDenseOps final : public DenseOps {
 public:
  explicit CudaDenseOps(Exec ex) : ex_(ex) {}
  std::size_t dense_workspace_bytes(DenseParams p) const override;
  void dense_forward(DenseParams p, const float* x, const float* w, const float* b, float* y,
                     void* workspace) const override;
  void dense_backward(DenseParams p, const float* x, const float* w, const float* dy, float* dx, float* dw,
                      float* db, void* workspace) const override;

 private:
  Exec ex_;
};

// loss.cu: a bad label skips its row and counts into *bad_labels (see LossOps). The reductions:
// elementwise.cu.
class CudaLossOps final : public LossOps {
 public:
  explicit CudaLossOps(Exec ex) : ex_(ex) {}
  std::size_t softmax_cross_entropy_workspace_bytes(SoftmaxXentParams p) const override;
  void softmax_cross_entropy(SoftmaxXentParams p, const float* logits, const std::int32_t* labels, float* loss,
                             float* dlogits, float* probs, std::int32_t* correct, std::int32_t* bad_labels,
                             void* workspace) const override;
  void reduce_sum(int members, std::size_t n, const float* x, float* out) const override;
  void reduce_mean(int members, std::size_t n, const float* x, float* out) const override;

 private:
  Exec ex_;
};

// metrics.cu: one item per element, row or member; the rows' calibration arithmetic is
// kernels/calibration.h, summed in row order.
class CudaMetricOps final : public MetricOps {
 public:
  explicit CudaMetricOps(Exec ex) : ex_(ex) {}
  void sum_members(int count, std::size_t n, const float* x, float* out, bool accumulate) const override;
  void divide(std::size_t n, float* x, float divisor) const override;
  void argmax_hits(int rows, int classes, const float* scores, const std::int32_t* labels,
                   std::int32_t* hits) const override;
  void accumulate_metrics(int count, const float* loss, const std::int32_t* correct, double rows, double* loss_sum,
                          std::int32_t* hits) const override;
  void mean_from_sums(int count, const double* sums, double divisor, float* out) const override;
  std::size_t calibration_workspace_bytes(CalibrationParams p) const override;
  void calibration_sums(CalibrationParams p, const float* probs, const std::int32_t* labels, double* sums,
                        void* workspace) const override;
  void predictions(int rows, int classes, const float* probs, std::int32_t* predicted, float* probability,
                   float* entropy) const override;

 private:
  Exec ex_;
};

// elementwise.cu: one item per element.
class CudaElementwiseOps final : public ElementwiseOps {
 public:
  explicit CudaElementwiseOps(Exec ex) : ex_(ex) {}
  void unary(UnaryOp op, std::size_t n, const float* x, float* y) const override;
  void activation_backward(UnaryOp op, std::size_t n, const float* y, const float* dy, float* dx) const override;
  void binary(BinaryOp op, std::size_t n, const float* a, std::size_t nb, const float* b, float* y) const override;

 private:
  Exec ex_;
};

// layout.cu: one item per output element (per input element for max_pool_backward), no atomics.
class CudaLayoutOps final : public LayoutOps {
 public:
  explicit CudaLayoutOps(Exec ex) : ex_(ex) {}
  void strided_copy(StridedCopyParams p, const float* src, float* dst) const override;
  void strided_reduce(ReduceOp op, StridedReduceParams p, const float* x, float* y) const override;
  void max_pool_forward(MaxPoolParams p, const float* x, float* y) const override;
  void max_pool_backward(MaxPoolParams p, const float* x, const float* dy, float* dx) const override;

 private:
  Exec ex_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(Exec ex)
      : ex_(ex), conv_(ex), dense_(ex), loss_(ex), optimizer_(ex), layers_(ex), metrics_(ex), elementwise_(ex),
        layout_(ex) {}
  std::string name() const override { return ex_.on_host() ? "cuda-on-host" : "cuda"; }
  DeviceKind kind() const override { return ex_.on_host() ? DeviceKind::cpu : DeviceKind::cuda; }

  const ConvOps& conv() const override { return conv_; }
  const DenseOps& dense() const override { return dense_; }
  const LossOps& loss() const override { return loss_; }
  const OptimizerOps& optimizer() const override { return optimizer_; }
  const LayerOps& layers() const override { return layers_; }
  const MetricOps& metrics() const override { return metrics_; }
  const ElementwiseOps& elementwise() const override { return elementwise_; }
  const LayoutOps& layout() const override { return layout_; }
  void copy(void* dst, const void* src, std::size_t bytes) const override { ex_.copy(dst, src, bytes); }
  void fill_zero(void* dst, std::size_t bytes) const override { ex_.fill_zero(dst, bytes); }
  void prepare() const override { ex_.prepare(); }
  bool captures() const override { return true; }
  std::unique_ptr<Graph> capture(const std::function<void()>& body) const override { return ex_.capture(body); }

 private:
  Exec ex_;
  CudaConvOps conv_;
  CudaDenseOps dense_;
  CudaLossOps loss_;
  CudaOptimizerOps optimizer_;
  CudaLayerOps layers_;
  CudaMetricOps metrics_;
  CudaElementwiseOps elementwise_;
  CudaLayoutOps layout_;
};

}  // namespace pmap::kernels::gpu
