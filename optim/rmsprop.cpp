// optim::RmsProp's leaf functions (optim/rmsprop.h), in Keras's order.
#include <pmapcc/optim/rmsprop.h>

#include <pmapcc/kernels/eager/array_ops_optim.h>

namespace pmap::optim {

void RmsProp::validate() const {
  detail::check_schedule(kName, "learning_rate", learning_rate);
  detail::require_unit_interval(kName, "rho", rho);
  detail::require_finite_nonnegative(kName, "momentum", momentum);
  detail::require_positive(kName, "epsilon", epsilon);
}

RmsPropState RmsProp::init_leaves(const Leaves& params) const {
  validate();
  RmsPropState s;
  s.count = detail::zero_count("optim::RmsProp::init", params);
  s.nu = detail::zeros_like(params);
  if (momentum > 0) s.trace = detail::zeros_like(params);
  return s;
}

std::vector<Array> RmsProp::update_leaves(const Leaves& grads, RmsPropState& state, const Leaves& params) const {
  validate();
  const char* fn = "optim::RmsProp::update";
  detail::check_count(fn, state.count, params);
  detail::check_same(fn, grads, "grads", detail::pointers(state.nu), "the state's nu");
  if (momentum > 0) detail::check_same(fn, grads, "grads", detail::pointers(state.trace), "the state's momentum trace");
  const Array lr = detail::learning_rate_at(learning_rate, state.count);
  const float rho_f = static_cast<float>(rho), one_minus_rho = static_cast<float>(1.0 - rho);
  std::vector<Array> updates;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Array& g = *grads[i];
    state.nu[i] = ops::add(ops::scale(state.nu[i], rho_f), ops::scale(ops::square(g), one_minus_rho));
    Array increment = ops::divide(ops::multiply(g, detail::per_member(kName, lr, g)),
                                  ops::sqrt(ops::scale(state.nu[i], 1.0f, epsilon)));
    if (momentum > 0) {
      state.trace[i] = ops::add(ops::scale(state.trace[i], momentum), increment);
      updates.push_back(ops::negative(state.trace[i]));
    } else {
      updates.push_back(ops::negative(increment));
    }
  }
  state.count = ops::eager::increment(state.count);
  return updates;
}

}  // namespace pmap::optim
