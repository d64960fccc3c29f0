// TrainState: what one device holds for its members between steps, a pmapcc tree of named tensors (so
// replicate, collectives and checkpoints treat it as one value), by role: the parameters; the model state
// (BatchNorm's moving statistics, in the model's state layout; empty for a model without state); the
// optimizer's state slots, each in the parameters' layout (model.h's TensorLayout: tensor by tensor,
// members stacked in each); and the step counter, which lives on the device so that learning-rate
// schedules and dropout masks read it there.
#pragma once

#include <map>
#include <string>

#include <pmap/array.h>
#include <pmap/tree.h>

namespace pmap::ensemble {

struct TrainState {
  Array params;                      // (members * P) f32
  Array state;                       // (members * S) f32
  std::map<std::string, Array> opt;  // the optimizer's slots by name (Optimizer::slots()), each (members * P) f32
  Array step;                        // (1) i64: the updates made so far
};
PMAPCC_TREE(TrainState, params, state, opt, step)

}  // namespace pmap::ensemble
