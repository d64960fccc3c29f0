#include <pmapcc/train/step.h>

#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pmap/collectives.h>
#include <pmap/pmap.h>
#include <pmapcc/core/grad.h>
#include <pmapcc/core/jit.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/batching.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/eager/array_ops_optim.h>
#include <pmapcc/optim/base.h>
#include <pmapcc/optim/transforms.h>

namespace pmap::train {

namespace {

constexpr const char* kDropoutRate = "dropout_rate";

// One member's loss () f32, logits (N, K), new model state and gradients (stacked over the members by map).
struct MemberGrads {
  Array loss;
  Array logits;
  Variables state;
  Variables grads;
};
PMAPCC_TREE(MemberGrads, loss, logits, state, grads)

// One member's new parameters and optimizer state.
struct MemberUpdate {
  Variables params;
  Variables opt;
};
PMAPCC_TREE(MemberUpdate, params, opt)

// What the jitted device step returns: the state's new parts (stacked) and the step's metrics.
struct Next {
  Variables params, state, opt;
  Array step;
  StepMetrics metrics;
};
PMAPCC_TREE(Next, params, state, opt, step, metrics)

// What one device step reads besides its arguments.
struct StepParts {
  Model model;
  Optimizer optimizer;
  Loss loss;
  StepOptions options;
};

// The model's Call::sharding: null when nothing is split.
const nn::Sharding* sharding_of(const StepOptions& options) {
  return options.sharding.empty() ? nullptr : &options.sharding;
}

// Every mesh axis leaf `name`'s spec splits it over (empty: whole).
AxisNames split_axes(const nn::Sharding& sharding, const std::string& name) {
  const auto it = sharding.params.by_path().find(name);
  AxisNames out;
  if (it == sharding.params.by_path().end()) return out;
  std::vector<std::string> names;
  for (const AxisNames& dim : it->second.dims())
    for (const std::string& a : dim.names()) names.push_back(a);
  return AxisNames(names);
}

// Each member's loss, logits, new model state and gradients on (x, y), `batch` members per vmap; `rows` place x
// in the global batch (data parallel; the dropout masks' offset).
MemberGrads member_grads(const StepParts& k, const TrainState& s, const Array& x, const Array& y, std::int64_t batch,
                         BatchRows rows) {
  const bool dp = k.options.data_parallel;
  const AxisNames bn_axis = dp ? AxisNames{k.options.axis} : AxisNames{};
  // Data parallel with blocks of different sizes: each device's mean loss weighted by its share of the batch
  // (N * devices / total), inside the gradient, so that the cotangents BatchNorm's VJP sums over the devices
  // are all the global mean's and the pmean of the gradients is the global batch's; BatchNorm counts the
  // total's rows. Equal blocks: weight 1 and the count of x's rows times the devices, as before.
  const std::int64_t shares = dp ? x.dim(0) * axis_size(bn_axis) : rows.total;
  const bool weighted = shares != rows.total;
  const auto weight = static_cast<float>(static_cast<double>(shares) / static_cast<double>(rows.total));
  auto grads_of = map(
      [&](const Variables& params, const Variables& state, const Array& key, const Variables& hyper) {
        const auto rate = hyper.find(kDropoutRate);
        const Call call{.train = true, .rng = {&key, &s.step, rows.offset}, .batch_axis = bn_axis,
                        .dropout_rate = rate == hyper.end() ? nullptr : &rate->second,
                        .batch_examples = weighted ? rows.total : 0, .sharding = sharding_of(k.options)};
        auto loss_fn = [&](const Variables& p) {
          auto [logits, next] = k.model.apply(p, state, x, call);
          Array value = k.loss(logits, y);
          if (weighted) value = ops::scale(value, weight);
          return std::make_pair(std::move(value), std::make_pair(std::move(logits), std::move(next)));
        };
        auto [value, grads] = value_and_grad(loss_fn, "the loss")(params);
        return MemberGrads{std::move(value.first), std::move(value.second.first), std::move(value.second.second),
                           std::move(grads)};
      },
      batch, {0, 0, 0, 0}, "the train step");
  return grads_of(s.params, s.state, s.dropout_keys, s.hyperparams);
}

// The hyper-parameters the optimizer takes: all but the model's dropout rate (views).
Variables optimizer_hyperparams(const Variables& hyper) {
  Variables out;
  for (const auto& [name, a] : hyper)
    if (name != kDropoutRate) out.emplace(name, vmap_detail::alias(a));
  return out;
}

Variables member_of(const Variables& stacked, std::int64_t m) {
  Variables out;
  for (const auto& [name, a] : stacked) out.emplace(name, core::member_view(a, m));
  return out;
}

// The members' new parameters and optimizer state: an element-by-element optimizer (optim/base.h's
// kElementwise) updates the stacked members at once with one state; any other, member by member on views of
// each member's slices (each its own state: a global norm's clipping is the member's), restacked.
MemberUpdate update_members(const Optimizer& optimizer, const TrainState& s, const Variables& grads,
                            const nn::Sharding& sharding) {
  std::optional<optim::SplitLeaves> split;  // a clipped norm over the split parameters' blocks: the unsplit one's
  if (!sharding.params.by_path().empty()) {
    std::vector<AxisNames> axes;
    for (const auto& entry : grads) axes.push_back(split_axes(sharding, entry.first));
    split.emplace(std::move(axes));
  }
  if (optimizer.elementwise()) {  // per-member hyper-parameters (members) along the leaves' member axis
    auto [updates, next] = optimizer.update(grads, s.opt, s.params, optimizer_hyperparams(s.hyperparams));
    return {optim::apply_updates(s.params, updates), std::move(next)};
  }
  const Variables hyper = optimizer_hyperparams(s.hyperparams);
  std::vector<MemberUpdate> parts;
  for (std::int64_t m = 0; m < s.dropout_keys.dim(0); ++m) {
    Variables p = member_of(s.params, m);
    auto [updates, next] = optimizer.update(member_of(grads, m), member_of(s.opt, m), p, member_of(hyper, m));
    parts.push_back({optim::apply_updates(p, updates), std::move(next)});
  }
  return stack_trees(parts);
}

// The members a vmap takes at once: options.member_batch, or by default one on CPU devices and all on GPUs.
std::int64_t members_per_vmap(const StepOptions& options, const Device& device, std::int64_t members) {
  return options.member_batch > 0 ? options.member_batch : (device.is_cpu() ? 1 : members);
}

Next device_step(const StepParts& k, const TrainState& s, const Array& x, const Array& y, BatchRows rows) {
  ops::DefaultPrecision precision(k.options.precision);
  const std::int64_t members = s.dropout_keys.dim(0);
  const std::int64_t batch = members_per_vmap(k.options, x.device(), members);
  MemberGrads g = member_grads(k, s, x, y, batch, rows);
  const AxisNames axis{k.options.axis};
  // Each replica: the global batch's gradient (one collective for every leaf on CPU devices).
  if (k.options.data_parallel) pmean_inplace(g.grads, axis);
  MemberUpdate u = update_members(k.optimizer, s, g.grads, k.options.sharding);
  StepMetrics m{std::move(g.loss), ops::eager::argmax_hits(g.logits, y)};
  if (k.options.data_parallel) m = {pmean(m.loss, axis), psum(m.correct, axis)};
  return {std::move(u.params), std::move(g.state), std::move(u.opt), ops::eager::increment(s.step), std::move(m)};
}

}  // namespace

namespace {

std::array<std::pair<const char*, const std::vector<float>*>, 3> hyper_lists(const MemberHyperparams& hyper) {
  return {std::pair{"learning_rate", &hyper.learning_rate}, std::pair{"weight_decay", &hyper.weight_decay},
          std::pair{kDropoutRate, &hyper.dropout_rate}};
}

}  // namespace

namespace detail {

Array block_of(const std::string& name, const Array& a, const P& spec, std::size_t first_dim) {
  const std::string about = "layout of " + name + " " + a.signature() + ": " + spec.str() + ": ";
  if (spec.size() + first_dim > a.shape().size())
    throw ValueError(about + "has " + std::to_string(spec.size()) + " entries for " +
                     std::to_string(a.ndim() - static_cast<int>(first_dim)) + " dimensions");
  std::vector<std::int64_t> start(a.shape().size(), 0), stop(a.shape().begin(), a.shape().end());
  for (std::size_t d = 0; d < spec.size(); ++d) {
    const AxisNames& axes = spec.dims()[d];
    if (axes.empty()) continue;
    const std::size_t at = d + first_dim;
    const std::int64_t n = axis_size(axes), i = axis_index(axes), len = a.dim(static_cast<int>(at));
    if (len % n != 0)
      throw ValueError(about + "dimension " + std::to_string(d) + " (" + std::to_string(len) + ") does not split " +
                       "over the " + std::to_string(n) + " devices of " + axes.str());
    start[at] = i * (len / n);
    stop[at] = (i + 1) * (len / n);
  }
  return ops::eager::slice(a, start, stop);
}

}  // namespace detail

void check_hyperparams(const MemberHyperparams& hyper, std::size_t members, const std::string& where) {
  for (const auto& [name, values] : hyper_lists(hyper)) {
    if (values->empty()) continue;
    const std::string field = where + name;
    if (values->size() != members)
      throw ValueError(field + " has " + std::to_string(values->size()) + " values for " + std::to_string(members) +
                       " members; it needs one per member (or none)");
    const bool dropout = std::string_view(name) == kDropoutRate;
    for (std::size_t m = 0; m < values->size(); ++m) {
      const float v = (*values)[m];
      if (!(v >= 0) || !std::isfinite(v) || (dropout && !(v < 1)))
        throw ValueError(field + "[" + std::to_string(m) + "] must be " + (dropout ? "in [0, 1)" : "finite and >= 0") +
                         ", got " + std::to_string(v));
    }
  }
}

Array softmax_cross_entropy_loss(const Array& logits, const Array& labels) {
  return ops::softmax_cross_entropy(logits, labels);
}

// The step's function: the rows as two numbers (a jitted function's static arguments are scalars).
using StepFunction = std::function<Next(const TrainState&, const Array&, const Array&, std::int64_t, std::int64_t)>;

struct TrainStep::Jit {
  Jitted<StepFunction> step;
};

TrainStep::TrainStep(Model model, Optimizer optimizer, Loss loss, StepOptions options)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), loss_(std::move(loss)), options_(std::move(options)) {
  if (!loss_) throw ValueError("TrainStep: the loss is an empty function");
  if (options_.axis.empty()) throw ValueError("TrainStep: options.axis is empty");
  if (options_.member_batch < 0)
    throw ValueError("TrainStep: options.member_batch must be >= 0, got " + std::to_string(options_.member_batch));
  // The rows are arguments, not read inside: a captured graph compares them on every call.
  StepFunction step = [parts = StepParts{model_, optimizer_, loss_, options_}](
                          const TrainState& s, const Array& x, const Array& y, std::int64_t offset,
                          std::int64_t total) { return device_step(parts, s, x, y, {offset, total}); };
  jit_ = std::make_shared<Jit>(Jit{jit(std::move(step), "the train step", {.graphs = options_.graphs})});
}

JitStats TrainStep::stats() const { return jit_->step.stats(); }

TrainState TrainStep::init(std::span<const Key> keys, const Device& device, const MemberHyperparams& hyper) const {
  if (keys.empty()) throw ValueError("TrainStep::init: no member keys");
  check_hyperparams(hyper, keys.size(), "TrainStep::init: hyperparams.");
  Variables hyperparams;
  for (const auto& [name, values] : hyper_lists(hyper)) {
    if (values->empty()) continue;
    const std::string field = std::string("TrainStep::init: hyperparams.") + name;
    if (std::string_view(name) == kDropoutRate) {
      if (model_.dropout_layers() == 0)
        throw ValueError(field + ": model '" + model_.name() + "' declares no Dropout layer (Model's dropout_layers)");
    } else if (!optimizer_.has_hyperparam(name))
      throw ValueError(field + ": " + optimizer_.name() + " has no per-member hyper-parameter '" + name + "'" +
                       detail::hyperparam_hint(name));
    std::vector<float> held(values->begin(), values->end());
    for (float& v : held) v += 0.0f;  // -0 as +0: the one-value forms compute with +0 (lr + 0, wd * x + 0)
    hyperparams.emplace(name, Array::from_host(held, {static_cast<std::int64_t>(held.size())}).to(device));
  }
  std::vector<Variables> params, states, opts;
  std::vector<std::uint32_t> dropout;
  for (const Key& k : keys) {
    auto [p, s] = model_.init(k, device);
    for (const auto& [name, spec] : options_.sharding.params.by_path()) {
      const auto it = p.find(name);
      if (it == p.end())
        throw ValueError("TrainStep::init: the layout names '" + name + "', which is not a parameter of model '" +
                         model_.name() + "'");
      if (!spec.replicated()) it->second = detail::block_of(name, it->second, spec);
    }
    if (!optimizer_.elementwise()) opts.push_back(optimizer_.init(p));
    params.push_back(std::move(p));
    states.push_back(std::move(s));
    const Key d = fold_in(k, kDropoutStream);
    dropout.insert(dropout.end(), {d.k0, d.k1});
  }
  Variables stacked = stack_trees(params);
  Variables opt = optimizer_.elementwise() ? optimizer_.init(stacked) : stack_trees(opts);  // as the step keeps it
  return {std::move(stacked), stack_trees(states), std::move(opt), std::move(hyperparams),
          Array::from_host(dropout, {static_cast<std::int64_t>(keys.size()), 2}).to(device),
          Array::from_host(std::vector<std::int64_t>{0}, {1}).to(device)};
}

StepMetrics TrainStep::operator()(TrainState& state, const Array& images, const Array& labels) const {
  check_batch(state, images, labels);
  const std::int64_t n = images.dim(0);
  if (!options_.data_parallel) return take(state, images, labels, {0, n});
  const AxisNames axis{options_.axis};
  return take(state, images, labels, {std::int64_t{axis_index(axis)} * n, n * axis_size(axis)});
}

StepMetrics TrainStep::operator()(TrainState& state, const Array& images, const Array& labels, BatchRows rows) const {
  check_batch(state, images, labels);
  const std::int64_t n = images.dim(0);
  const std::string given = "TrainStep: rows {offset " + std::to_string(rows.offset) + ", total " +
                            std::to_string(rows.total) + "} for a block of " + std::to_string(n) + " examples";
  if (!options_.data_parallel && (rows.offset != 0 || rows.total != n))
    throw ValueError(given + ": an ensemble's members each see the whole batch, {0, " + std::to_string(n) + "}");
  if (rows.offset < 0 || rows.total < n || rows.offset > rows.total - n)
    throw ValueError(given + ": the block must lie within the global batch, 0 <= offset <= total - " +
                     std::to_string(n));
  return take(state, images, labels, rows);
}

StepMetrics TrainStep::take(TrainState& state, const Array& images, const Array& labels, BatchRows rows) const {
  Next next = jit_->step(state, images, labels, rows.offset, rows.total);
  state.params = std::move(next.params);
  state.state = std::move(next.state);
  state.opt = std::move(next.opt);
  state.step = std::move(next.step);
  return std::move(next.metrics);
}

Array TrainStep::logits(const TrainState& state, const Array& images) const {
  check_images(state, images);
  ops::DefaultPrecision precision(options_.precision);
  const std::int64_t batch = members_per_vmap(options_, images.device(), state.dropout_keys.dim(0));
  auto infer = map([&](const Variables& params, const Variables& model_state) {
    Call call;
    call.sharding = sharding_of(options_);
    return model_.apply(params, model_state, images, call).first;
  }, batch, {0, 0}, "the model's inference");
  return infer(state.params, state.state);
}

void TrainStep::check_batch(const TrainState& state, const Array& images, const Array& labels) const {
  check_images(state, images);
  if (!labels.valid() || labels.dtype() != DType::i32 || labels.ndim() != 1 || labels.dim(0) != images.dim(0))
    throw ShapeError("TrainStep: labels are " + (labels.valid() ? labels.signature() : std::string("empty")) +
                     "; they must be i32 (" + std::to_string(images.dim(0)) + "), one per image");
  if (labels.device() != state.step.device())
    throw DeviceError("TrainStep: the batch is on " + images.device().str() + " and " + labels.device().str() +
                      ", the state on " + state.step.device().str());
}

void TrainStep::check_images(const TrainState& state, const Array& images) const {
  const Shape& in = model_.input_shape();
  if (!images.valid() || images.dtype() != DType::f32 || images.ndim() != 4 || images.dim(1) != in[0] ||
      images.dim(2) != in[1] || images.dim(3) != in[2] || images.dim(0) < 1)
    throw ShapeError("TrainStep: images are " + (images.valid() ? images.signature() : std::string("empty")) +
                     "; model '" + model_.name() + "' takes f32 (N, " + std::to_string(in[0]) + ", " +
                     std::to_string(in[1]) + ", " + std::to_string(in[2]) + ")");
  if (!state.dropout_keys.valid() || state.dropout_keys.ndim() != 2 || !state.step.valid())
    throw ValueError("TrainStep: the state is not one TrainStep::init made");
  if (images.device() != state.step.device())
    throw DeviceError("TrainStep: the images are on " + images.device().str() + ", the state on " +
                      state.step.device().str());
}

}  // namespace pmap::train
