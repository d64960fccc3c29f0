// The program's flags on the differentiable core: what a TrainConfig (the command line) means for
// train::Trainer. The model by its --model name; the optimizer of
// --optimizer with its schedule (--lr-schedule, --warmup-steps), clipping (--clip-norm) and decay
// (--weight-decay); each member's own --lr, --weight-decay and --dropout values; and the Trainer's options.
// Errors name the flag. Weights split over "model" (--mode model-parallel, --mesh AxM with M > 1) are the
// Trainer's sharding by --layout (recipe_sharding). The rest is the caller's: the mesh
// (--devices, --backend, --kernels, --pin-threads), the validation split and early stopping (train/data.h's
// split_validation, train::EarlyStopping: run_steps then counts the steps of the training set after the
// hold-out), and the checks of --precision against the CPU (the Trainer's first step refuses bf16 where it
// cannot run, naming the op).
//
// Where its run was the runner's (the training layer before issue #51, whose checkpoints still resume): bit
// for bit for SGD and Adam without weight decay, any schedule, clipping, per-member rates and dropout; with a
// weight decay, within the rounding of optim/adam.h's updates (a member of decay 0 beside decaying ones takes
// the decay's arithmetic too: the runner decided that device by device, the Trainer for all).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <pmap/mesh.h>

#include <pmapcc/nn/parallel.h>
#include <pmapcc/train/model.h>
#include <pmapcc/train/optimizer.h>
#include <pmapcc/train/trainer.h>

#include "examples/mnist_ensemble/config.h"

namespace pmap::ensemble {

// c.model on `data`'s images (rows, cols, 1) and classes. ValueError naming --model for an unknown name.
train::Model recipe_model(const TrainConfig& c, const Dataset& data);

// The optimizer of `o` for `members` members and a run of `run_steps` steps (a cosine schedule without its
// steps decays over the run's steps after --warmup-steps, as the runner's): SGD with momentum (Nesterov),
// Adam or AdamW (Keras's betas and epsilon) with --lr's rate (a per-member list: its first value, replaced
// per member by recipe_hyperparams) under the schedule, the decoupled decay of --weight-decay, and, with
// --clip-norm, each member's gradients clipped to that global norm first. ValueError naming the flag for a
// setting that cannot run (OptimizerConfig::check's, and a warmup that leaves a cosine no step of a run that has
// steps).
train::Optimizer recipe_optimizer(const OptimizerConfig& o, int members, std::int64_t run_steps);

// The per-member values of a hyper-parameter ensemble: --lr and --weight-decay when they give one value per
// member (a single value is the optimizer's own), --dropout's rate (one value or one per member, each member
// its own). Empty lists where nothing is per member. ValueError naming the flag for a list of another length or
// a value out of range.
train::MemberHyperparams recipe_hyperparams(const TrainConfig& c, int members);

// The Trainer's options for `members` members: mode (model-parallel: one model, data parallel over the mesh's
// first axis), batch, seed, report interval, evaluation batch, members per vmap (--member-group), precision, and
// the per-member values. The sharding is recipe_sharding's (set it apart: it needs the model and the mesh).
train::TrainerOptions recipe_options(const TrainConfig& c, int members);

// --layout (c.layout: the user's rules, then the reference layout's) resolved against `model`'s parameters on a
// mesh of `axes` (the mode's axis, then "model"): the Trainer's options.sharding, and what the header prints.
struct RecipeSharding {
  nn::Sharding sharding;      // empty unless c.splits_weights()
  std::string split;          // "Dense_0/kernel (None, 'model'), ..." in the model's order; empty: none split
  std::int64_t local_params = 0;  // one member's weights a device holds
  std::int64_t full_params = 0;   // one member's weights
};
// Each parameter takes the first rule whose pattern matches its whole name; a layer's output is
// "<layer>/output". ValueError naming the parameter, its shape, its layout and the rule's pattern for a layout of
// more entries than dimensions, an axis the mesh does not have, used twice, or the first axis (it holds other
// members or examples), and a dimension the axis's size does not divide; naming the rule for a user's rule that
// gives nothing its layout. (What the layers cannot run, nn::TensorParallel refuses when the Trainer is made.)
RecipeSharding recipe_sharding(const TrainConfig& c, const train::Model& model, const std::vector<AxisSpec>& axes);

}  // namespace pmap::ensemble
