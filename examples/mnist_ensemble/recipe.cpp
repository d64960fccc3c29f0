// The program's flags on the differentiable core (recipe.h).
#include "examples/mnist_ensemble/recipe.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pmap/error.h>
#include <pmap/random.h>
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
// decay's arithmetic, a member of decay 0 too (the runner decided device by device; a 0 decays by nothing either
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
  train::TrainerOptions t;
  t.members = members;
  t.data_parallel = c.mode != Mode::ensemble;  // model parallel: one model, its batch split over "data" too
  t.batch_size = c.batch_size;
  t.seed = c.seed;
  t.hyperparams = recipe_hyperparams(c, members);
  t.report_every = c.report_every;
  t.eval_batch = c.eval_batch;
  t.member_batch = c.member_group;
  t.precision = c.precision;
  t.graphs = c.graphs;
  return t;
}

RecipeSharding recipe_sharding(const TrainConfig& c, const train::Model& model, const std::vector<AxisSpec>& axes) {
  RecipeSharding out;
  const auto [params, state] = model.init(key(0), Device{});  // the shapes (on the host)
  for (const std::string& name : model.param_names()) out.full_params += params.at(name).size();
  out.local_params = out.full_params;
  if (!c.splits_weights()) return out;
  const LayoutMap& layouts = c.layout;
  std::vector<bool> used(layouts.entries().size(), false);
  std::vector<std::string> layers;  // "<layer>/output" of each parameter's prefix, once, in model order
  std::string weights;
  for (const std::string& name : model.param_names()) {
    const Array& a = params.at(name);
    weights += (weights.empty() ? "" : ", ") + name;
    const std::string layer = name.substr(0, name.rfind('/')) + "/output";
    if (name.find('/') != std::string::npos && std::find(layers.begin(), layers.end(), layer) == layers.end())
      layers.push_back(layer);
    std::optional<std::size_t> from;
    const PartitionSpec spec = layouts.layout_of(name, &from);
    if (!from) continue;
    used[*from] = true;
    const Shape& shape = a.shape();
    const std::string where = "layout of " + name + " (shape " + shape_str(shape) + "): " + spec.str() +
                              " (from pattern '" + layouts.entries()[*from].pattern + "'): ";
    if (spec.dims.size() > shape.size())
      throw ValueError(where + "has " + std::to_string(spec.dims.size()) + " entries for a " +
                       std::to_string(shape.size()) + "-dimensional weight");
    std::vector<AxisNames> dims;
    std::vector<std::string> seen;
    std::int64_t local = a.size();
    for (std::size_t d = 0; d < spec.dims.size(); ++d) {
      dims.emplace_back();
      if (!spec.dims[d]) continue;
      const std::string& axis = *spec.dims[d];
      const auto it = std::find_if(axes.begin(), axes.end(), [&](const AxisSpec& x) { return x.name == axis; });
      if (it == axes.end()) {
        std::string names;
        for (const AxisSpec& x : axes) names += (names.empty() ? "" : ", ") + ("'" + x.name + "'");
        throw ValueError(where + "'" + axis + "' is not an axis of the mesh (" + names + ")");
      }
      if (it == axes.begin())
        throw ValueError(where + "splits it over '" + axis + "', which holds " +
                         (c.mode == Mode::ensemble ? "other members" : "other examples") +
                         ": weights may be split over 'model' only (--layout)");
      if (std::find(seen.begin(), seen.end(), axis) != seen.end())
        throw ValueError(where + "axis '" + axis + "' splits two dimensions");
      seen.push_back(axis);
      if (shape[d] % it->size != 0)
        throw ValueError(where + "dimension " + std::to_string(d) + " (" + std::to_string(shape[d]) +
                         ") is not divisible by the size of '" + axis + "' (" + std::to_string(it->size) + ")");
      local /= it->size;
      dims.back() = AxisNames(axis);
    }
    out.local_params += local - a.size();
    if (spec.replicated()) continue;
    out.sharding.params.set(name, P::from_dims(std::move(dims)));
    out.split += (out.split.empty() ? "" : ", ") + name + " " + spec.str();
  }
  for (const std::string& layer : layers) {
    std::optional<std::size_t> from;
    const PartitionSpec spec = layouts.layout_of(layer, &from);
    if (!from) continue;
    used[*from] = true;
    std::vector<AxisNames> dims;
    for (const auto& d : spec.dims) dims.push_back(d ? AxisNames(*d) : AxisNames());
    out.sharding.outputs.set(layer, P::from_dims(std::move(dims)));
  }
  // A user's rule that gives nothing its layout (it matches no name, or an earlier rule takes every name it
  // matches) would be ignored without a word: a typo, another model's name.
  for (std::size_t i = 0; i < layouts.entries().size(); ++i) {
    const LayoutMap::Entry& e = layouts.entries()[i];
    if (e.must_match && !used[i])
      throw ValueError("layout rule '" + e.pattern + "=" + e.spec.str() + "' gives no weight of model '" +
                       model.name() + "' its layout: it matches none, or an earlier rule takes them (its weights: " +
                       weights + "; a layer's output is '<layer>/output')");
  }
  return out;
}

}  // namespace pmap::ensemble
