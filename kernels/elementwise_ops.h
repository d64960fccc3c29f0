// ElementwiseOps: the op family of element-wise arithmetic and activations on f32 buffers, what the Array
// functions of kernels/eager/array_ops.h run on (the layers use their own fused ops). One CPU implementation per
// ISA variant (kernels/cpu/elementwise.cpp) and one CUDA one (kernels/cuda/elementwise.cu), both computing
// each element with kernels/elementwise_math.h, so the CUDA kernels run on the host give the CPU's bits (on
// a GPU, exp, log, tanh and the sigmoid come from CUDA's math library: within 2 ulp of the host's).
// Pointers are in the memory of the backend's device and ops are ordered as kernels/backend.h says.
#pragma once

#include <cstddef>
#include <cstdint>

#include <pmapcc/kernels/op_list.h>

namespace pmap::kernels {

enum class UnaryOp : std::uint8_t {
  negative,  // -x
  abs,       // |x|
  square,    // x * x
  sqrt,      // sqrt(x) (NaN below 0)
  exp,       // e^x
  log,       // natural log (-inf at 0, NaN below 0)
  relu,      // max(x, 0); a NaN stays NaN
  sigmoid,   // 1 / (1 + e^-x)
  tanh,      // tanh(x)
};

enum class BinaryOp : std::uint8_t {
  add,       // a + b
  subtract,  // a - b
  multiply,  // a * b
  divide,    // a / b
  maximum,   // the larger; NaN when either is NaN (numpy.maximum)
  minimum,   // the smaller; NaN when either is NaN (numpy.minimum)
};

const char* to_string(UnaryOp op);   // "negative", "abs", ...: the names of kernels/eager/array_ops.h's functions
const char* to_string(BinaryOp op);  // "add", ...

class ElementwiseOps {
 public:
  virtual ~ElementwiseOps() = default;

  // The ops, each with its contract: kernels/elementwise_ops.def.
#define PMAPCC_OP PMAPCC_OP_VIRTUAL
#include <pmapcc/kernels/elementwise_ops.def>
};

}  // namespace pmap::kernels
