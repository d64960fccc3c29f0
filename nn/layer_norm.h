// LayerNorm as a module (flax.linen.LayerNorm, Keras's LayerNormalization over the last axis), written of
// pmap::ops alone: grad, vmap, jit, the summary and the ONNX export follow it with nothing of its own, and no
// kernel was added for it (it is what adding a layer costs: this file, its source and its test).
//
//   const nn::LayerNorm norm;
//   nn::LayerNormParams p = norm.init(x.dim(-1), x.device());   // scale ones, bias zeros
//   Array y = norm(p, x);                                        // x's shape
#pragma once

#include <cstdint>

#include <pmap/array.h>
#include <pmap/tree.h>

#include <pmapcc/core/ops.h>

namespace pmap::nn {

struct LayerNormParams {  // Flax's names
  Array scale;            // (F) from ones
  Array bias;             // (F) from zeros
};
PMAPCC_TREE(LayerNormParams, scale, bias)

// Over x (..., F), each row of F features alone (no batch statistics, no state, the same in training and
// inference): y = (x - mean) / sqrt(variance + epsilon) * scale + bias, the mean and the biased variance of
// the row, the variance computed as the mean of (x - mean)^2 (Flax's use_fast_variance=False; in double
// within each reduction, rounded once, as every ops:: reduction). ShapeError naming nn::LayerNorm when
// scale or bias is not (F); ValueError for an epsilon that is not positive and finite.
struct LayerNorm {
  float epsilon = 1e-6f;  // Flax's default (Keras's LayerNormalization: 1e-3)

  // scale ones and bias zeros, (features) each, on `device`.
  LayerNormParams init(std::int64_t features, const Device& device = {}) const;
  Array operator()(const LayerNormParams& p, const Array& x) const;
};

}  // namespace pmap::nn
