// LossOps: the op family of the training loss, softmax cross-entropy, and of per-member reductions. One
// implementation per CPU ISA variant (kernels/cpu/loss.cpp) and one CUDA one (kernels/cuda/loss.cu).
// Pointers are in the memory of the backend's device and ops are ordered as kernels/backend.h says;
// SoftmaxXentParams is kernels/ops.h's.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmapcc/kernels/op_list.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

class LossOps {
 public:
  virtual ~LossOps() = default;

  // The ops, each with its contract: kernels/loss_ops.def.
#define PMAPCC_OP PMAPCC_OP_VIRTUAL
#include <pmapcc/kernels/loss_ops.def>
};

}  // namespace pmap::kernels
