// The runner's names for the training data, which live in train/data.h (the runner goes with issue #51).
#pragma once

#include <pmapcc/train/data.h>

namespace pmap::ensemble {
using train::Dataset;
using train::gather_batch;
using train::load_idx_pair;
using train::load_mnist;
using train::Split;
using train::split_validation;
using train::steps_per_epoch;
}  // namespace pmap::ensemble
