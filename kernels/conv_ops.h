// ConvOps: the op family of the layers over images (M, N, H, W, C), channels last: convolution and average
// pooling. One implementation per CPU ISA variant (kernels/cpu/conv.cpp, pool.cpp) and one CUDA one
// (kernels/cuda/conv.cu, pool.cu). Pointers are in the memory of the backend's device and ops are ordered
// as kernels/backend.h says; shapes and parameter structs are kernels/ops.h's.
#pragma once

#include <cstddef>

#include <pmapcc/kernels/op_list.h>
#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

class ConvOps {
 public:
  virtual ~ConvOps() = default;

  // The ops, each with its contract: kernels/conv_ops.def.
#define PMAPCC_OP PMAPCC_OP_VIRTUAL
#include <pmapcc/kernels/conv_ops.def>
};

}  // namespace pmap::kernels
