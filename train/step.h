// The Trainer's step on the differentiable core: one device's stacked members take one jitted optimizer step
// (module code forward, value_and_grad, the Optimizer's update) on its batch, as an ensemble or data parallel.
//
// Ensemble mode: every member sees the device's whole batch. Data parallel: the batch is split over the axis,
// the gradients are pmean'd over it and BatchNorm normalizes over the global batch, so replicas that start
// from the same keys stay bitwise identical. Dropout masks depend on (member key, step, global example index)
// only, not on the devices or the split. Each device plans its buffers on its first step and replays the plan.
//
//   train::TrainStep step(train::flax_cnn(), train::Optimizer(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f}));
//   auto states = pmap::pmap([&](int) {   // ensemble: device d's members; data parallel: every member, everywhere
//     return step.init(std::span(keys).subspan(axis_index("ensemble") * per_device, per_device), current_device());
//   }, mesh)(0);
//   auto metrics = pmap::pmap([&](train::TrainState& s, const Array& x, const Array& y) { return step(s, x, y); },
//                             mesh, "ensemble")(states, replicate(x, mesh), replicate(y, mesh));
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <pmap/array.h>
#include <pmap/random.h>
#include <pmap/tree.h>

#include <pmapcc/core/jit.h>
#include <pmapcc/kernels/ops.h>
#include <pmapcc/train/model.h>
#include <pmapcc/train/optimizer.h>

namespace pmap::train {

// A member's dropout key is fold_in(its key, kDropoutStream) (as the program has always derived it).
inline constexpr std::uint32_t kDropoutStream = 0x64726f70;

// One device's members between steps, each tensor stacked on a leading member axis.
struct TrainState {
  Variables params;    // (members, ...)
  Variables state;     // the model state (BatchNorm's moving statistics), (members, ...)
  Variables opt;       // the optimizer's state: an element-by-element one (Optimizer::elementwise) of the stacked
                       // members, one count; any other each member's, (members, ...)
  Variables hyperparams;  // per-member hyper-parameters by name, (members) f32 each (init's MemberHyperparams):
                          // "learning_rate", "weight_decay" injected into the optimizer at each step,
                          // "dropout_rate" the model's Call::dropout_rate; empty: the optimizer's and model's own.
                          // Checked by init only: values put here later are used as they are
  Array dropout_keys;  // (members, 2) u32
  Array step;          // (1) i64: the steps taken
};
PMAPCC_TREE(TrainState, params, state, opt, hyperparams, dropout_keys, step)

// A hyper-parameter ensemble: each member its own learning rate, weight decay or dropout rate, one value per
// member of TrainStep::init's keys (an empty list: the optimizer's or the model's own value for all). The
// learning rate replaces the schedule's base rate (its warmup and decay still apply); it and the weight decay
// must be hyper-parameters the optimizer takes (Optimizer::has_hyperparam: Sgd, Adam, AdamW, RmsProp the
// learning rate; AdamW, add_decayed_weights, and Sgd and Adam given a weight_decay the weight decay; in a
// chain, the one transformation that has it). The dropout rate, in [0, 1), replaces the rate of every Dropout
// layer of the model (Call::dropout_rate; a model that declares no Dropout layer, Model::dropout_layers,
// refuses it). A member trains bit for bit as
// it would with its values given to all. Data parallel: give every replica the same values.
struct MemberHyperparams {
  std::vector<float> learning_rate = {};
  std::vector<float> weight_decay = {};
  std::vector<float> dropout_rate = {};
};

// Checks the lists of `hyper` for `members` members: each one value per member (or none), each value finite and
// >= 0 (a dropout rate in [0, 1)). ValueError "<where><field>..." naming the list, or the member and its value.
void check_hyperparams(const MemberHyperparams& hyper, std::size_t members, const std::string& where);

// What a step leaves on the device per member.
struct StepMetrics {
  Array loss;     // (members) f32: the mean loss over the batch (data parallel: the global batch's)
  Array correct;  // (members) i32: the batch's examples classified right (data parallel: over the global batch)
};
PMAPCC_TREE(StepMetrics, loss, correct)

// The loss of a batch's logits (N, K) f32 and labels (N) i32: a scalar f32, differentiable in the logits; the
// mean over the examples (data parallel weights it by the block's share of the batch).
using Loss = std::function<Array(const Array& logits, const Array& labels)>;
Array softmax_cross_entropy_loss(const Array& logits, const Array& labels);  // ops::softmax_cross_entropy

// Where a device's block sits in a data-parallel step's global batch, when the blocks differ in size (a batch
// that does not split evenly over the devices: Trainer's are 43, 43 and 42 examples of 128 on 3 devices).
struct BatchRows {
  std::int64_t offset = 0;  // the global index of the block's first example (the dropout masks')
  std::int64_t total = 0;   // the global batch's examples: every device's block together
};

struct StepOptions {
  std::string axis = "ensemble";   // the mesh axis the step runs over (its collectives' axis)
  bool data_parallel = false;      // the batch is split over `axis`: gradients pmean'd, BatchNorm global
  std::int64_t member_batch = 0;   // members per vmap (pmap::map's batch_size); 0: one on CPU devices, all on GPUs
  kernels::Precision precision = kernels::Precision::fp32;  // of the conv and dense products
  // Tensor parallelism: the parameters split by sharding.params over mesh axes other than `axis` (a mesh's
  // "model" axis), each device holding its blocks of them (init takes each member's from its whole tensors), and
  // the model's Call::sharding. The loss and the logits are every device's of the axes alike; a clipped norm is
  // the unsplit model's (optim::SplitLeaves). Empty: nothing split.
  nn::Sharding sharding = {};
  // Replay the step as one graph where the backend records graphs (CUDA; JitOptions::graphs); false runs its
  // kernels one by one every step (to compare). Changes no result.
  bool graphs = true;
};

namespace detail {
// This device's block (inside pmap) of tensor `a` whose dimensions from `first_dim` on are a parameter `name`'s
// (1: stacked members first), split as `spec` says. ValueError naming the parameter for a spec of more entries than
// its dimensions or a dimension its axes' size does not divide.
Array block_of(const std::string& name, const Array& a, const P& spec, std::size_t first_dim = 0);
}  // namespace detail

class TrainStep {
 public:
  TrainStep(Model model, Optimizer optimizer, Loss loss = softmax_cross_entropy_loss, StepOptions options = {});

  const Model& model() const { return model_; }
  const Optimizer& optimizer() const { return optimizer_; }
  const StepOptions& options() const { return options_; }

  // The members of `keys` on `device` (inside pmap when options().sharding splits parameters: this device's
  // blocks of them): each member's variables from model().init(key), its optimizer state, its dropout key and
  // its hyper-parameters of `hyper`, stacked; the step counter zero. ValueError naming the
  // field of `hyper` for a list that is not one value per key, a value that is negative or not finite (a
  // dropout rate not below 1), a hyper-parameter the optimizer does not take, or dropout rates for a model
  // that declares no Dropout layer; for a layout that does not fit a parameter (a spec of more entries than its
  // dimensions, or a dimension its axes' size does not divide), naming it.
  TrainState init(std::span<const Key> keys, const Device& device, const MemberHyperparams& hyper = {}) const;

  // One step of this device's members on its batch (inside pmap over options().axis): state becomes the
  // next. images (N, H, W, C) f32 of the model's input shape, labels (N) i32, on the state's device
  // (ShapeError / DeviceError otherwise). Data parallel: every device's block has the same N.
  StepMetrics operator()(TrainState& state, const Array& images, const Array& labels) const;
  // Data parallel, with blocks of any sizes (N >= 1 each): `rows` places this device's block in the global
  // batch (the overload above takes equal blocks: use this one for others). The step is the global batch's:
  // each device's loss weighted by N * devices / rows.total inside the gradient, so the pmean is the global
  // mean, BatchNorm's statistics over rows.total examples (Call::batch_examples), the dropout
  // masks by global index; so it equals one device's step on the whole batch, up to the sums' order. Every
  // device must give the same total and blocks that tile [0, total) (not checked: that would cost a
  // collective). ValueError for a total or offset that cannot hold this block, or rows other than {0, N} in
  // an ensemble.
  StepMetrics operator()(TrainState& state, const Array& images, const Array& labels, BatchRows rows) const;

  // The logits (members, N, classes) f32 of this device's members on images (N, H, W, C) in inference
  // (BatchNorm's moving statistics, no dropout), at options().precision, options().member_batch members per
  // vmap; run op by op (not jitted: an evaluation's last batch may be shorter). ShapeError / DeviceError as
  // operator() for images that do not fit.
  Array logits(const TrainState& state, const Array& images) const;

  // The jitted step's counts over every device (core/jit.h): one trace per device, then replays.
  JitStats stats() const;

 private:
  struct Jit;
  StepMetrics take(TrainState& state, const Array& images, const Array& labels, BatchRows rows) const;
  void check_images(const TrainState& state, const Array& images) const;
  void check_batch(const TrainState& state, const Array& images, const Array& labels) const;
  Model model_;
  Optimizer optimizer_;
  Loss loss_;
  StepOptions options_;
  std::shared_ptr<Jit> jit_;
};

}  // namespace pmap::train
