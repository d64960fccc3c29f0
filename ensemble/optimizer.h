// Optimizers as parts, in optax's shape: an Optimizer names the per-parameter state it keeps (its slots,
// each a buffer in the parameters' layout: init is zeros) and updates one parameter tensor of M members
// from its gradients. What every optimizer shares runs around it in optimizer_step(): the learning rate of
// the schedule, computed on the device from the device's step counter (so a captured CUDA graph uses the
// right rate at every replay), gradient clipping by global norm, decoupled weight decay, and per-member
// hyper-parameters (each ensemble member its own learning rate and weight decay).
//
// A new optimizer is a class implementing Optimizer (its own .cpp, with its kernels in
// kernels/optimizer_ops.h) and one line in the registry of optimizer.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/mesh.h>

#include <pmapcc/ensemble/model.h>
#include <pmapcc/ensemble/train_state.h>
#include <pmapcc/kernels/optimizer_ops.h>

namespace pmap::ensemble {

// A learning-rate schedule (kernels::ScheduleParams), as the program's --lr-schedule writes it:
//   constant                    the base rate
//   cosine[:ALPHA]              cosine decay to ALPHA x the base rate (default 0) over decay_steps
//   exponential:RATE:STEPS      the base rate x RATE^(step / STEPS)
//   piecewise:S1=F1,S2=F2,...   the base rate x Fi from step Si on (S increasing; x1 before S1)
// and warmup_steps of linear warmup from 0 before any of them (--warmup-steps).
struct Schedule {
  kernels::ScheduleKind kind = kernels::ScheduleKind::constant;
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 0;                         // cosine: 0 means the rest of the run (the Trainer fills it in)
  double decay_rate = 1.0;                              // exponential
  double alpha = 0.0;                                   // cosine
  std::vector<std::pair<std::int64_t, double>> pieces;  // piecewise: (from step, factor)

  std::string str() const;                 // the --lr-schedule text that parses back to this (without warmup)
  kernels::ScheduleParams params() const;  // ValueError naming --lr-schedule when it cannot be run
};
// ValueError naming --lr-schedule and what is wrong (an unknown kind, a bad number, zero or negative steps).
Schedule parse_schedule(std::string_view text);

// Everything an optimizer is built from. Keras's defaults: adam/adamw beta_1 0.9, beta_2 0.999, epsilon 1e-7;
// adamw's weight decay 0.004.
struct OptimizerConfig {
  std::string name = "sgd";                // sgd | adam | adamw (optimizer_names())
  std::vector<float> learning_rate;        // empty: the optimizer's default (sgd 0.1; adam, adamw 0.001); else
                                           // one for every member, or one per member (a hyper-parameter ensemble)
  float momentum = 0.9f;                   // sgd
  bool nesterov = false;                   // sgd
  double beta_1 = 0.9, beta_2 = 0.999;     // adam, adamw
  float epsilon = 1e-7f;                   // adam, adamw
  std::vector<float> weight_decay;         // empty: the optimizer's default; else one, or one per member
  float clip_norm = 0.0f;                  // > 0: clip each member's gradients to this global norm
  Schedule schedule;

  // "sgd lr 0.1, momentum 0.9", "adamw lr 0.001, weight decay 0.004, clip norm 1, cosine after 100 warmup
  // steps": what the program's header prints.
  std::string str() const;
  // The weight decay of global member g (learning_rate likewise): the default, one value for all, or the
  // member's own (ValueError naming the flag when the list has no value for it).
  float weight_decay_of(int member) const;
  float learning_rate_of(int member) const;
  // Every member's learning rate (weight decay): one value when all share it, else one per member.
  std::vector<float> learning_rates(int members) const;
  std::vector<float> weight_decays(int members) const;
  // ValueError naming the flag (--optimizer, --lr, --momentum, --weight-decay, --clip-norm, --lr-schedule,
  // --warmup-steps) for a value out of range, or per-member lists that are not `members` long.
  void check(int members) const;
};

class Optimizer {
 public:
  static constexpr std::size_t kMaxSlots = 4;
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // The per-parameter state, by name ("momentum"; "m", "v"): each a buffer in the parameters' layout,
  // zero at the start. Checkpoints hold slot s of tensor t as "opt/<s>/<t>".
  virtual const std::vector<std::string>& slots() const = 0;  // at most kMaxSlots
  // Per-step, per-member values computed once before the tensors' updates (Adam's step size), from lr (M)
  // into aux (M); the default computes nothing.
  virtual void prepare(const kernels::OptimizerOps& ops, int members, const std::int64_t* step, const float* lr,
                       float* aux) const;
  // Updates one tensor of `members` members ((members, n) blocks) in place: params and its slots (in
  // slots() order), from grads; s and aux as prepared.
  virtual void update(const kernels::OptimizerOps& ops, int members, std::size_t n, kernels::UpdateScalars s,
                      const float* aux, float* params, float* const* slots, const float* grads) const = 0;
};

// The optimizers (sgd.cpp, adam.cpp), from the fields of c that they use.
std::unique_ptr<Optimizer> make_sgd(const OptimizerConfig& c);
std::unique_ptr<Optimizer> make_adam(const OptimizerConfig& c);  // adam and adamw (the name is c.name)

// The registered names: "sgd", "adam", "adamw".
std::vector<std::string> optimizer_names();
// The optimizer of c.name; ValueError naming --optimizer for an unknown one.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c);

// The per-member scalars of one device's optimizer steps, in its memory: the members' base learning rates
// and weight decays, and this step's learning rates, Adam step sizes, squared norms and clipping factors.
struct OptimizerWork {
  // For `members` members on `device`, global members first .. first + members - 1 of c.
  OptimizerWork(const OptimizerConfig& c, int members, int first, Device device);
  Array base_lr;        // (M) f32
  Array weight_decay;   // (M) f32
  Array lr;             // (M) f32
  Array aux;            // (M) f32
  Array sumsq;          // (M) f64
  Array clip;           // (M) f32
  bool decays = false;  // any weight decay
};

// What optimizer_step needs besides the optimizer: the schedule (Schedule::params(), its decay steps
// resolved) and the clipping norm (0: off). With the weights split (model parallelism) and clipping, the
// global norm needs every device's blocks: split_tensors[k] says that the model's tensor k is a block of a
// tensor split over split_axes, whose sums of squares a psum over those axes completes (inside the step's
// pmap); the other tensors are whole on every device and count once. Empty: nothing is split.
struct UpdateOptions {
  kernels::ScheduleParams schedule;
  float clip_norm = 0.0f;
  std::vector<bool> split_tensors;
  AxisNames split_axes;

  // Whether optimizer_step calls a collective (the psum of clipping with split tensors), which meets the
  // other devices on the host: such an update cannot be captured in a graph.
  bool meets_devices() const {
    return clip_norm > 0 && std::find(split_tensors.begin(), split_tensors.end(), true) != split_tensors.end();
  }
};

// One optimizer step of a device's members on state (its params and opt slots, in `model`'s layout) from
// grads (members * P), then state.step += 1; every value stays on the device (no host read), so it can
// be captured in a graph.
void optimizer_step(const Optimizer& opt, UpdateOptions u, const kernels::OptimizerOps& ops, const Sequential& model,
                    OptimizerWork& work, TrainState& state, const float* grads);

// A train state for `params` ((members * P) f32 on its device): opt's slots zero, step 0, and state_floats
// (members * S) of model state, zero, on the same device.
TrainState make_train_state(const Optimizer& opt, Array params, std::int64_t state_floats = 0);

}  // namespace pmap::ensemble
