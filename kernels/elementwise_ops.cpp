// ElementwiseOps' names and argument checks, shared by the CPU variants and the CUDA ops.
#include <pmapcc/kernels/elementwise_math.h>

#include <pmap/error.h>

#include <string>

#include <pmapcc/kernels/ops.h>

namespace pmap::kernels {

const char* to_string(UnaryOp op) {
  switch (op) {
    case UnaryOp::negative: return "negative";
    case UnaryOp::abs: return "abs";
    case UnaryOp::square: return "square";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::relu: return "relu";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::tanh: return "tanh";
  }
  return "?";
}

const char* to_string(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::subtract: return "subtract";
    case BinaryOp::multiply: return "multiply";
    case BinaryOp::divide: return "divide";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
  }
  return "?";
}

void check_unary(const char* what, std::size_t n, const float* x, const float* y) {
  if (n == 0) return;
  require(x, what, "x");
  require(y, what, "y");
}

void check_activation_backward(UnaryOp op, std::size_t n, const float* y, const float* dy, const float* dx) {
  const std::string what = std::string(to_string(op)) + "_grad";
  if (!has_activation_grad(op)) {
    throw ValueError("activation_backward: " + std::string(to_string(op)) +
                     " has no gradient from its output (relu, sigmoid, tanh and exp have)");
  }
  if (n == 0) return;
  require(y, what.c_str(), "y");
  require(dy, what.c_str(), "dy");
  require(dx, what.c_str(), "dx");
}

void check_binary(BinaryOp op, std::size_t n, const float* a, std::size_t nb, const float* b, const float* y) {
  const char* what = to_string(op);
  if (nb == 0 ? n != 0 : n % nb != 0) {
    throw ValueError(std::string(what) + ": b's " + std::to_string(nb) + " elements do not divide a's " +
                     std::to_string(n) + " (b must be as long as a, one value, or a's trailing block)");
  }
  if (n == 0) return;
  require(a, what, "a");
  require(b, what, "b");
  require(y, what, "y");
}

}  // namespace pmap::kernels
