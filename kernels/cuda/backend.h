// Internal to the CUDA kernels: the CUDA Backend, on the memory of its Exec's target. With Exec::gpu() every
// op is asynchronous: it queues kernels and GEMMs on the calling thread's current stream on its current GPU
// and allocates nothing (given workspaces), so a sequence of ops can be captured in a CUDA graph. With
// Exec::host() (kernels::cuda_backend_on_host) the same kernels run on the host over their whole launch
// grid, on host memory: how the CUDA code is checked without a GPU. Bad parameters and null pointers throw
// pmap::ValueError before anything is queued. The contracts are kernels/backend.h's; the element-wise ops,
// the ensemble step's reductions and the loss rows give the CPU's bits, being compiled without FMA
// contraction (-fmad=false) and computed in the CPU's order. Each family's class takes its ops from the
// family's list (kernels/op_list.h), where each op is declared once; its bodies are in the family's .cu file.
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
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/optimizer_ops.def>

 private:
  Exec ex_;
};

// layers.cu: one item per element, per (member, channel) for the sums and statistics.
class CudaLayerOps final : public LayerOps {
 public:
  explicit CudaLayerOps(Exec ex) : ex_(ex) {}
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/layer_ops.def>

 private:
  Exec ex_;
};

// conv.cu: im2col + one strided-batched GEMM over the members (a shared input im2col'ed once), bias and
// fused ReLU in one epilogue pass; a shared input's dx summed over members in member order. A null
// workspace takes Exec::scratch, which allocates when it grows. pool.cu: one item per output element.
class CudaConvOps final : public ConvOps {
 public:
  explicit CudaConvOps(Exec ex) : ex_(ex) {}
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/conv_ops.def>

 private:
  Exec ex_;
};

// dense.cu: a null workspace is always allowed (db is then summed in one pass).
class CudaDenseOps final : public DenseOps {
 public:
  explicit CudaDenseOps(Exec ex) : ex_(ex) {}
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/dense_ops.def>

 private:
  Exec ex_;
};

// loss.cu: a bad label skips its row and counts into *bad_labels (see LossOps). The reductions:
// elementwise.cu.
class CudaLossOps final : public LossOps {
 public:
  explicit CudaLossOps(Exec ex) : ex_(ex) {}
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/loss_ops.def>

 private:
  Exec ex_;
};

// metrics.cu: one item per element, row or member; the rows' calibration arithmetic is
// kernels/calibration.h, summed in row order.
class CudaMetricOps final : public MetricOps {
 public:
  explicit CudaMetricOps(Exec ex) : ex_(ex) {}
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/metric_ops.def>

 private:
  Exec ex_;
};

// elementwise.cu: one item per element.
class CudaElementwiseOps final : public ElementwiseOps {
 public:
  explicit CudaElementwiseOps(Exec ex) : ex_(ex) {}
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/elementwise_ops.def>

 private:
  Exec ex_;
};

// layout.cu: one item per output element (per input element for max_pool_backward), no atomics.
class CudaLayoutOps final : public LayoutOps {
 public:
  explicit CudaLayoutOps(Exec ex) : ex_(ex) {}
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/layout_ops.def>

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
