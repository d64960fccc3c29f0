// The program's flags on the differentiable core (recipe.h).
#include "examples/mnist_ensemble/recipe.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <pmap/error.h>
#include <pmapcc/optim/optim.h>

namespace pmap::ensemble {
namespace {

// The schedule of --lr-schedule and --warmup-steps from `base`; a cosine without its steps decays over the
// run's steps after the warmup.
optim::Schedule schedule_of(const OptimizerConfig& o, float base, std::int64_t run_steps) {
  Schedule s = o.schedule;
  if (s.kind == kernels::ScheduleKind::cosine && s.decay_steps == 0) {
    if (run_steps > 0 && run_steps - s.warmup_steps < 1)  // (a run of no step, to evaluate: any length)
      throw ValueError("--lr-schedule " + s.str() + ": --warmup-steps " + std::to_string(s.warmup_steps) +
                       " leaves none of the run's " + std::to_string(run_steps) + " steps for the decay");
    s.decay_steps = std::max<std::int64_t>(1, run_steps - s.warmup_steps);
  }
  return optim::Schedule(base, s.params());
}

// The optimizer itself, then clipped first when --clip-norm asks for it.
template <class Tx> train::Optimizer clipped(const OptimizerConfig& o, Tx tx) {
  if (o.clip_norm > 0) return train::Optimizer(optim::chain(optim::clip_by_global_norm(o.clip_norm), std::move(tx)));
  return train::Optimizer(std::move(tx));
}

// A flag's per-member list when it gives one value per member of several, else empty (one value for all).
std::vector<float> per_member(const std::vector<float>& values, int members) {
  return members > 1 && values.size() == static_cast<std::size_t>(members) ? values : std::vector<float>{};
}

// The first member's decay that is not 0, or 0 when no member decays. When one does, every member takes the
// decay's arithmetic, a member of decay 0 too (the runner decides device by device; a 0 decays by nothing either
// way, rounded apart only by the updates' form). It is the optimizer's decay: every member's when it is one
// value; with one per member, the value that marks SGD and Adam as decaying (each member's own replaces it).
float first_decay(const OptimizerConfig& o, int members) {
  const std::vector<float> wds = o.weight_decays(members);
  const auto it = std::find_if(wds.begin(), wds.end(), [](float w) { return w != 0.0f; });
  return it == wds.end() ? 0.0f : *it;
}

}  // namespace

train::Model recipe_model(const TrainConfig& c, const Dataset& data) {
  return train::model_by_name(c.model, {data.rows, data.cols, 1}, data.num_classes, "--model");
}

train::Optimizer recipe_optimizer(const OptimizerConfig& o, int members, std::int64_t run_steps) {
  o.check(members);
  const optim::Schedule lr = schedule_of(o, o.learning_rate_of(0), run_steps);
  const float decay = first_decay(o, members);
  if (o.name == "sgd")
    return clipped(o, optim::Sgd{.learning_rate = lr, .momentum = o.momentum, .nesterov = o.nesterov,
                                 .weight_decay = decay});
  if (o.name == "adam")
    return clipped(o, optim::Adam{.learning_rate = lr, .beta_1 = o.beta_1, .beta_2 = o.beta_2,
                                  .epsilon = o.epsilon, .weight_decay = decay});
  if (o.name == "adamw")
    return clipped(o, optim::AdamW{.learning_rate = lr, .beta_1 = o.beta_1, .beta_2 = o.beta_2,
                                   .epsilon = o.epsilon, .weight_decay = decay});
  throw ValueError("--optimizer " + o.name + ": the Trainer has no recipe for it");
}

train::MemberHyperparams recipe_hyperparams(const TrainConfig& c, int members) {
  c.optimizer.check(members);
  if (c.dropout.size() > 1 && c.dropout.size() != static_cast<std::size_t>(members))
    throw ValueError("--dropout gives " + std::to_string(c.dropout.size()) + " values for " + std::to_string(members) +
                     " member(s): give one value, or one per member");
  for (float d : c.dropout)
    if (!(d >= 0.0f && d < 1.0f)) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", static_cast<double>(d));
      throw ValueError(std::string("--dropout must be in [0, 1), got ") + text);
    }
  train::MemberHyperparams h;
  h.learning_rate = per_member(c.optimizer.learning_rate, members);
  if (first_decay(c.optimizer, members) != 0.0f) h.weight_decay = per_member(c.optimizer.weight_decay, members);
  if (c.dropout.size() == 1) h.dropout_rate.assign(static_cast<std::size_t>(members), c.dropout[0]);
  if (c.dropout.size() > 1) h.dropout_rate = c.dropout;
  return h;
}

train::TrainerOptions recipe_options(const TrainConfig& c, int members) {
  if (c.mode == Mode::model_parallel)
    throw ValueError("--mode model-parallel splits weights over 'model', which the Trainer does not (yet)");
  if (c.mesh_model > 1)
    throw ValueError("--mesh " + c.mesh_text() + " splits weights over 'model', which the Trainer does not (yet)");
  train::TrainerOptions t;
  t.members = members;
  t.data_parallel = c.mode == Mode::data_parallel;
  t.batch_size = c.batch_size;
  t.seed = c.seed;
  t.hyperparams = recipe_hyperparams(c, members);
  t.report_every = c.report_every;
  t.eval_batch = c.eval_batch;
  t.member_batch = c.member_group;
  t.precision = c.precision;
  return t;
}

}  // namespace pmap::ensemble
