// TrainState: what one device holds for its members between steps (a pmapcc tree, so replicate,
// psum, checkpointing treat it as one value). params and momentum use Sequential's layout.
#pragma once

#include <cstdint>

#include <pmap/array.h>
#include <pmap/tree.h>

namespace pmap::ensemble {

struct TrainState {
  Array params;      // (members * P) f32
  Array momentum;    // (members * P) f32, optax's SGD trace
  std::int64_t step = 0;
};
PMAPCC_TREE(TrainState, params, momentum, step)

}  // namespace pmap::ensemble
