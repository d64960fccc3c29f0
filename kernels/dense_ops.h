// DenseOps: the op family of fully connected layers, y = x @ w + b for each member. One implementation per
// CPU ISA variant (kernels/cpu/dense.cpp) and one CUDA one (kernels/cuda/dense.cu). Pointers are in the
// memory of the backend's device and ops are ordered as kernels/backend.h says; DenseParams is
// kernels/ops.h's.
#pragma once

#include <cstddef>

#include <pmapcc/kernels/op_list.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

class DenseOps {
 public:
  virtual ~DenseOps() = default;

  // The ops, each with its contract: kernels/dense_ops.def.
#define PMAPCC_OP PMAPCC_OP_VIRTUAL
#include <pmapcc/kernels/dense_ops.def>
};

}  // namespace pmap::kernels
