// Modules as Flax writes them, in C++: a module is a small value (its hyper-parameters) with
// init(key, input size, device) -> its parameters (a tree), and a call (params, x) -> y built from
// pmap::ops, so grad follows it. A model is an ordinary C++ function of modules: its parameters a
// PMAPCC_TREE struct of the modules' (named as checkpoints name them: "Conv_0/kernel"), its forward pass
// plain code, so branches and residual sums need nothing special.
//
//   const nn::Conv conv{.features = 32};
//   const nn::Dense dense{.features = 10};
//   struct Params { nn::ConvParams Conv_0; nn::DenseParams Dense_0; };
//   PMAPCC_TREE(Params, Conv_0, Dense_0)
//   Params init(Key key) { return {conv.init(fold_in(key, 0), 1), dense.init(fold_in(key, 1), 28 * 28 * 32)}; }
//   Array forward(const Params& p, const Array& x) {                  // x (N, 28, 28, 1)
//     Array h = conv(p.Conv_0, x, /*relu=*/true);                      // (N, 28, 28, 32)
//     return dense(p.Dense_0, ops::reshape(h, {x.dim(0), 28 * 28 * 32}));
//   }
#pragma once

#include <cstdint>
#include <string>

#include <pmap/array.h>
#include <pmap/random.h>
#include <pmap/tree.h>

#include <pmapcc/core/ops.h>

namespace pmap::nn {

enum class Init { lecun_normal, glorot_uniform };  // the kernel's initializer; biases start at zero

struct DenseParams {
  Array kernel;  // (in, features)
  Array bias;    // (features)
};
PMAPCC_TREE(DenseParams, kernel, bias)

// flax.linen.Dense: y = x @ kernel + bias over x's last axis (and max(y, 0) with relu, fused).
struct Dense {
  int features = 0;
  Init kernel_init = Init::lecun_normal;

  // The kernel from `key` (bias zeros) for inputs of `in` features, on `device`.
  DenseParams init(Key key, std::int64_t in, const Device& device = {}) const;
  Array operator()(const DenseParams& p, const Array& x, bool relu = false) const;
};

struct ConvParams {
  Array kernel;  // (KH, KW, Cin, features), HWIO
  Array bias;    // (features)
};
PMAPCC_TREE(ConvParams, kernel, bias)

// A convolution without a bias (Keras's Conv2D(use_bias=False), before a BatchNorm that centres).
struct ConvKernel {
  Array kernel;  // (KH, KW, Cin, features), HWIO
};
PMAPCC_TREE(ConvKernel, kernel)

// flax.linen.Conv over NHWC images: cross-correlation with "SAME" (default) or "VALID" padding.
struct Conv {
  int features = 0;
  int kernel_h = 3, kernel_w = 3;
  int stride_h = 1, stride_w = 1;
  bool same = true;
  Init kernel_init = Init::lecun_normal;

  ConvParams init(Key key, std::int64_t in_channels, const Device& device = {}) const;
  // The kernel alone, drawn as init draws it: for a convolution without a bias.
  ConvKernel init_kernel(Key key, std::int64_t in_channels, const Device& device = {}) const;
  Array operator()(const ConvParams& p, const Array& x, bool relu = false) const;
  Array operator()(const ConvKernel& p, const Array& x, bool relu = false) const;
  // Its settings as a summary shows them: "24, 6x6, stride 2, valid, no bias".
  std::string settings(bool bias, bool relu) const;
};

}  // namespace pmap::nn
