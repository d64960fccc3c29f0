// pmap::optim in one include: optax-style optimizers (Sgd, Adam, AdamW, RmsProp), transformations
// (clip_by_global_norm, add_decayed_weights, chain), schedules and apply_updates.
#pragma once

#include <pmapcc/optim/adam.h>
#include <pmapcc/optim/base.h>
#include <pmapcc/optim/rmsprop.h>
#include <pmapcc/optim/schedules.h>
#include <pmapcc/optim/sgd.h>
#include <pmapcc/optim/transforms.h>
