// BatchNorm and Dropout as modules (Flax's nn.BatchNorm and nn.Dropout, Keras's BatchNormalization and
// Dropout): small values holding their hyper-parameters, whose calls take the variables and say whether the
// step trains. BatchNorm has state beside its parameters (the moving statistics, Flax's "batch_stats"): a
// call returns the new state with the output, and the step threads it to the next, as Flax's
// apply(..., mutable=["batch_stats"]) does.
//
//   const nn::BatchNorm bn{.axis_name = {"data"}};                   // the global batch's statistics
//   auto [h, stats] = bn(p.BatchNorm_0, s.BatchNorm_0, x, {.train = true, .relu = true});
//   h = nn::Dropout{.rate = 0.5f}(h, {.train = true, .rng = {&key, &opt_state.count}});
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <pmap/array.h>
#include <pmap/tree.h>

#include <pmapcc/core/ops.h>

namespace pmap::nn {

struct BatchNormParams {  // Keras's names (and the program's checkpoints')
  Array gamma;            // (C) the scale, from ones
  Array beta;             // (C) the offset, from zeros
};
PMAPCC_TREE(BatchNormParams, gamma, beta)

// Keras's BatchNormalization(scale=False): the offset only (a ReLU follows, so a scale adds nothing).
struct BatchNormCenter {
  Array beta;  // (C)
};
PMAPCC_TREE(BatchNormCenter, beta)

struct BatchNormState {
  Array moving_mean;      // (C) from zeros
  Array moving_variance;  // (C) from ones
};
PMAPCC_TREE(BatchNormState, moving_mean, moving_variance)

struct BatchNormCall {
  bool train = false;  // the batch's statistics (and new moving ones); else the moving statistics
  bool relu = false;   // max(y, 0), fused
  // Training over axis_name with devices' batches of different sizes: the examples of all of them together
  // (ops::BatchNormOptions::batch_examples; train::Call::batch_examples). 0: every device's batch the same.
  std::int64_t batch_examples = 0;
};

// BatchNormalization over x (..., C): every axis but the last is a row. In training it normalizes with the
// batch's mean and (biased) variance, over the devices of axis_name too when it is set (Flax's
// BatchNorm(axis_name=); when the devices' batches differ in size, BatchNormCall::batch_examples gives their
// total), and returns the moving statistics moved towards them (moving * momentum + batch * (1 - momentum));
// in inference it uses the moving ones and returns them unchanged. Differentiable in x and the parameters;
// the state is not differentiated.
struct BatchNorm {
  float momentum = 0.99f;  // Keras's defaults (Flax's: 0.99 and 1e-5)
  float epsilon = 1e-3f;
  AxisNames axis_name = {};

  BatchNormParams init(std::int64_t channels, const Device& device = {}) const;
  BatchNormCenter init_center(std::int64_t channels, const Device& device = {}) const;
  BatchNormState init_state(std::int64_t channels, const Device& device = {}) const;
  std::pair<Array, BatchNormState> operator()(const BatchNormParams& p, const BatchNormState& s, const Array& x,
                                              BatchNormCall call = {}) const;
  std::pair<Array, BatchNormState> operator()(const BatchNormCenter& p, const BatchNormState& s, const Array& x,
                                              BatchNormCall call = {}) const;
  // Its settings as a summary shows them: "momentum 0.99, epsilon 0.001, no scale".
  std::string settings(bool scale, bool relu) const;
};

// Where a step's dropout masks come from: a key (2) u32 and the step counter (1) i64 on the device (an
// optimizer state's count), both the caller's (they must outlive the call), and the global index of this
// device's first row (data parallel: train::BatchRows::offset, axis_index("data") * rows for equal blocks),
// so a mask depends on neither the device count nor the split.
struct Rng {
  const Array* key = nullptr;
  const Array* step = nullptr;
  std::int64_t example_offset = 0;
};

struct DropoutCall {
  bool train = false;  // in inference, x itself
  Rng rng;             // read only in training
  // Training: this member's rate, one f32 value in [0, 1) on the device, in place of Dropout::rate (a
  // hyper-parameter ensemble's, train::Call::dropout_rate); null: the layer's own.
  const Array* rate = nullptr;
};

// Inverted dropout (Keras's Dropout(rate)): in training each value is zeroed with probability rate and the
// rest scaled by 1 / (1 - rate). `stream` tells a model's dropout layers apart (0, 1, ... in model order,
// as the program numbers them), so two layers draw different masks from one Rng.
struct Dropout {
  float rate = 0.5f;
  std::uint32_t stream = 0;

  Array operator()(const Array& x, const DropoutCall& call) const;
};

}  // namespace pmap::nn
