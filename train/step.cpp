#include <pmapcc/train/step.h>

#include <utility>
#include <vector>

#include <pmap/collectives.h>
#include <pmap/pmap.h>
#include <pmapcc/core/grad.h>
#include <pmapcc/core/jit.h>
#include <pmapcc/core/ops.h>
#include <pmapcc/core/vmap.h>
#include <pmapcc/kernels/array_ops.h>
#include <pmapcc/kernels/array_ops_optim.h>
#include <pmapcc/optim/base.h>

namespace pmap::train {

namespace {

// One member's loss, logits, new model state and gradients (stacked over the members by map).
struct MemberGrads {
  Array loss;
  Array logits;
  Variables state;
  Variables grads;
};
PMAPCC_TREE(MemberGrads, loss, logits, state, grads)

struct MemberUpdate {
  Variables params;
  Variables opt;
};
PMAPCC_TREE(MemberUpdate, params, opt)

// What the jitted device step returns: the state's new parts and the step's metrics.
struct Next {
  Variables params, state, opt;
  Array step;
  StepMetrics metrics;
};
PMAPCC_TREE(Next, params, state, opt, step, metrics)

}  // namespace

Array softmax_cross_entropy_loss(const Array& logits, const Array& labels) {
  return ops::softmax_cross_entropy(logits, labels);
}

struct TrainStep::Jit {
  Jitted<std::function<Next(const TrainState&, const Array&, const Array&)>> step;
};

TrainStep::TrainStep(Model model, Optimizer optimizer, Loss loss, StepOptions options)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), loss_(std::move(loss)), options_(std::move(options)) {
  if (!loss_) throw ValueError("TrainStep: the loss is an empty function");
  if (options_.axis.empty()) throw ValueError("TrainStep: options.axis is empty");
  if (options_.member_batch < 0)
    throw ValueError("TrainStep: options.member_batch must be >= 0, got " + std::to_string(options_.member_batch));
  std::function<Next(const TrainState&, const Array&, const Array&)> device_step =
      [model = model_, optimizer = optimizer_, loss_of = loss_, options = options_](const TrainState& s, const Array& x,
                                                                                   const Array& y) {
        ops::DefaultPrecision precision(options.precision);
        const std::int64_t batch =
            options.member_batch > 0 ? options.member_batch : (x.device().is_cpu() ? 1 : s.dropout_keys.dim(0));
        const bool dp = options.data_parallel;
        const std::int64_t offset = dp ? std::int64_t{axis_index(options.axis)} * x.dim(0) : 0;
        const AxisNames bn_axis = dp ? AxisNames{options.axis} : AxisNames{};
        auto grads_of = map(
            [&](const Variables& params, const Variables& state, const Array& key) {
              const Call call{.train = true, .rng = {&key, &s.step, offset}, .batch_axis = bn_axis};
              auto loss_fn = [&](const Variables& p) {
                auto [logits, next] = model.apply(p, state, x, call);
                Array value = loss_of(logits, y);
                return std::make_pair(std::move(value), std::make_pair(std::move(logits), std::move(next)));
              };
              auto [value, grads] = value_and_grad(loss_fn, "the loss")(params);
              return MemberGrads{std::move(value.first), std::move(value.second.first),
                                 std::move(value.second.second), std::move(grads)};
            },
            batch, {0, 0, 0}, "the train step");
        MemberGrads g = grads_of(s.params, s.state, s.dropout_keys);
        if (dp) pmean_inplace(g.grads, AxisNames{options.axis});  // each replica: the global batch's gradient
        MemberUpdate u;
        if (optimizer.elementwise()) {  // the stacked members at once, one state (optim/base.h's kElementwise)
          auto [updates, next] = optimizer.update(g.grads, s.opt, s.params);
          u = {optim::apply_updates(s.params, updates), std::move(next)};
        } else {
          // Member by member on views of its slices (each member's own state: a global norm's clipping is
          // the member's), joined along the member axis.
          const std::int64_t members = s.dropout_keys.dim(0);
          const std::string fn = "the optimizer update";
          std::vector<MemberUpdate> parts;
          for (std::int64_t k = 0; k < members; ++k) {
            Variables p = vmap_detail::members_tree(fn, s.params, k, 1);
            auto [updates, next] = optimizer.update(vmap_detail::members_tree(fn, g.grads, k, 1),
                                                    vmap_detail::members_tree(fn, s.opt, k, 1), p);
            parts.push_back({optim::apply_updates(p, updates), std::move(next)});
          }
          u = members == 1 ? std::move(parts[0])
                           : vmap_detail::join_trees(fn, parts, [](const std::vector<const Array*>& column, const Array&) {
                               return vmap_detail::joined_members(column);
                             });
        }
        StepMetrics m{std::move(g.loss), ops::eager::argmax_hits(g.logits, y)};
        if (dp) {
          m.loss = pmean(m.loss, AxisNames{options.axis});
          m.correct = psum(m.correct, AxisNames{options.axis});
        }
        return Next{std::move(u.params), std::move(g.state), std::move(u.opt), ops::eager::increment(s.step),
                    std::move(m)};
      };
  jit_ = std::make_shared<Jit>(Jit{jit(std::move(device_step), "the train step")});
}

TrainState TrainStep::init(std::span<const Key> keys, const Device& device) const {
  if (keys.empty()) throw ValueError("TrainStep::init: no member keys");
  std::vector<Variables> params, states, opts;
  std::vector<std::uint32_t> dropout;
  for (const Key& k : keys) {
    auto [p, s] = model_.init(k, device);
    if (!optimizer_.elementwise()) opts.push_back(optimizer_.init(p));
    params.push_back(std::move(p));
    states.push_back(std::move(s));
    const Key d = fold_in(k, kDropoutStream);
    dropout.insert(dropout.end(), {d.k0, d.k1});
  }
  Variables stacked = stack_trees(params);
  Variables opt = optimizer_.elementwise() ? optimizer_.init(stacked) : stack_trees(opts);
  return {std::move(stacked), stack_trees(states), std::move(opt),
          Array::from_host(dropout, {static_cast<std::int64_t>(keys.size()), 2}).to(device),
          Array::from_host(std::vector<std::int64_t>{0}, {1}).to(device)};
}

StepMetrics TrainStep::operator()(TrainState& state, const Array& images, const Array& labels) const {
  Next next = jit_->step(state, images, labels);
  state.params = std::move(next.params);
  state.state = std::move(next.state);
  state.opt = std::move(next.opt);
  state.step = std::move(next.step);
  return std::move(next.metrics);
}

}  // namespace pmap::train
