// optim::Sgd's leaf functions (optim/sgd.h), in optax.sgd's order of operations.
#include <pmapcc/optim/sgd.h>

#include <pmapcc/kernels/eager/array_ops_optim.h>

namespace pmap::optim {

void Sgd::validate() const {
  detail::check_schedule(kName, "learning_rate", learning_rate);
  detail::require_finite_nonnegative(kName, "momentum", momentum);
  detail::require_finite_nonnegative(kName, "weight_decay", weight_decay);
}

SgdState Sgd::init_leaves(const Leaves& params) const {
  validate();
  SgdState s;
  s.count = detail::zero_count("optim::Sgd::init", params);
  s.trace = detail::zeros_like(params);
  return s;
}

std::vector<Array> Sgd::update_leaves(const Leaves& grads, SgdState& state, const Leaves& params) const {
  validate();
  detail::check_count("optim::Sgd::update", state.count, params);
  detail::check_same("optim::Sgd::update", grads, "grads", detail::pointers(state.trace), "the state's trace");
  const Array lr = detail::learning_rate_at(learning_rate, state.count);
  std::vector<Array> updates;
  const kernels::SgdParams fused{.momentum = momentum, .nesterov = nesterov};
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Array& g = *grads[i];
    detail::check_per_member(kName, lr, g);  // per-member rates: one per row of each leaf's member axis
    // Outside grad and vmap (no operand traced), one pass (kernels::OptimizerOps::sgd_trace, the same bits as
    // the ops below); inside them, the ops, so that a transformation follows the update.
    if (pmap::detail::trace_tag(g) == 0 && pmap::detail::trace_tag(state.trace[i]) == 0 &&
        pmap::detail::trace_tag(lr) == 0) {
      auto [trace, update] = ops::eager::sgd_trace(fused, g, state.trace[i], lr);
      updates.push_back(std::move(update));
      state.trace[i] = std::move(trace);
      continue;
    }
    // scale's offset is -0, which adds nothing to any value (+0 would turn a -0 product into +0).
    Array next = ops::add(ops::scale(state.trace[i], momentum, -0.0f), g);  // momentum * m + g
    if (nesterov) {
      updates.push_back(ops::negative(
          ops::multiply(ops::add(g, ops::scale(next, momentum, -0.0f)), detail::per_member(kName, lr, g))));
    } else {
      updates.push_back(ops::negative(ops::multiply(next, detail::per_member(kName, lr, g))));  // -(lr * m)
    }
    state.trace[i] = std::move(next);
  }
  if (weight_decay != 0.0f || weight_decays) {  // from the decayed parameters: (p - (p * wd) * lr + u) - p
    for (std::size_t i = 0; i < updates.size(); ++i) {
      const Array& p = *params[i];
      updates[i] = ops::subtract(ops::add(detail::decayed(kName, p, weight_decay, weight_decays, lr), updates[i]), p);
    }
  }
  state.count = ops::eager::increment(state.count);
  return updates;
}

}  // namespace pmap::optim
