// Internal to the CPU kernels: one ISA variant's backend. kernels/cpu/*.cpp are compiled once per variant
// (generic: the baseline ISA; avx2: -mavx2 -mfma), each into its own namespace pmap::kernels::cpu::<variant>
// (PMAPCC_CPU_NS), so the two builds share no symbol; each defines the Ops members it implements, and the
// variant's one exported symbol is its entry point, extern "C" pmapcc_cpu_backend_<variant>()
// (kernels/cpu/backend.cpp). The contracts are kernels/backend.h's and kernels/cpu_backend.h's. Each family's
// class takes its ops from the family's list (kernels/op_list.h), where each op is declared once.
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
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/optimizer_ops.def>
};

// layers.cpp
class LayerOpsImpl final : public LayerOps {
 public:
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/layer_ops.def>
};

// conv.cpp, pool.cpp
class ConvOpsImpl final : public ConvOps {
 public:
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/conv_ops.def>
};

// dense.cpp
class DenseOpsImpl final : public DenseOps {
 public:
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/dense_ops.def>
};

// loss.cpp; softmax_cross_entropy's bad_labels and workspace are unused: a bad label raises ValueError.
// The reductions: elementwise.cpp.
class LossOpsImpl final : public LossOps {
 public:
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/loss_ops.def>
};

// elementwise.cpp
class ElementwiseOpsImpl final : public ElementwiseOps {
 public:
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/elementwise_ops.def>
};

// layout.cpp
class LayoutOpsImpl final : public LayoutOps {
 public:
#define PMAPCC_OP PMAPCC_OP_OVERRIDE
#include <pmapcc/kernels/layout_ops.def>
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
