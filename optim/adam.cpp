// optim::Adam's and optim::AdamW's leaf functions (optim/adam.h), in Keras's order of operations.
#include <pmapcc/optim/adam.h>

#include <pmapcc/kernels/eager/array_ops_optim.h>
#include <pmapcc/kernels/optimizer_ops.h>

namespace pmap::optim {
namespace {

struct Hyper {
  const char* name;
  const Schedule& learning_rate;
  double beta_1, beta_2;
  float epsilon;
};

void check(const Hyper& h) {
  detail::check_schedule(h.name, "learning_rate", h.learning_rate);
  detail::require_unit_interval(h.name, "beta_1", h.beta_1);
  detail::require_unit_interval(h.name, "beta_2", h.beta_2);
  detail::require_positive(h.name, "epsilon", h.epsilon);
}

AdamState init_moments(const Hyper& h, const Leaves& params) {
  check(h);
  AdamState s;
  s.count = detail::zero_count((std::string(h.name) + "::init").c_str(), params);
  s.mu = detail::zeros_like(params);
  s.nu = detail::zeros_like(params);
  return s;
}

// Moves the moments one step and returns Adam's steps (mu alpha) / (sqrt(nu) + epsilon), positive, one per
// leaf; lr receives the step's rate. Increments the count.
std::vector<Array> adam_steps(const Hyper& h, const Leaves& grads, AdamState& state, const Leaves& params, Array& lr) {
  check(h);
  const std::string fn = std::string(h.name) + "::update";
  detail::check_count(fn.c_str(), state.count, params);
  detail::check_same(fn.c_str(), grads, "grads", detail::pointers(state.mu), "the state's mu");
  detail::check_same(fn.c_str(), grads, "grads", detail::pointers(state.nu), "the state's nu");
  lr = detail::learning_rate_at(h.learning_rate, state.count);
  const kernels::AdamParams kp{h.beta_1, h.beta_2, h.epsilon};
  const Array alpha = ops::eager::adam_step_size(kp, state.count, lr);
  const float one_minus_beta_1 = static_cast<float>(1.0 - h.beta_1);
  const float one_minus_beta_2 = static_cast<float>(1.0 - h.beta_2);
  std::vector<Array> steps;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Array& g = *grads[i];
    state.mu[i] = ops::add(state.mu[i], ops::scale(ops::subtract(g, state.mu[i]), one_minus_beta_1));
    state.nu[i] = ops::add(state.nu[i], ops::scale(ops::subtract(ops::square(g), state.nu[i]), one_minus_beta_2));
    Array denominator = ops::scale(ops::sqrt(state.nu[i]), 1.0f, h.epsilon);  // sqrt(nu) * 1 + epsilon, exact
    steps.push_back(ops::divide(ops::multiply(state.mu[i], detail::per_member(h.name, alpha, g)), denominator));
  }
  state.count = ops::eager::increment(state.count);
  return steps;
}

// Adam's steps taken from the decayed parameters: (p - (p * wd) * lr - step) - p per leaf, or -step without
// decay (p + (-step) == p - step in IEEE arithmetic).
std::vector<Array> decoupled_updates(const char* name, const std::vector<Array>& steps, const Leaves& params,
                                     float decay, const std::shared_ptr<const Array>& decays, const Array& lr) {
  std::vector<Array> updates;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (decay == 0.0f && !decays) {
      updates.push_back(ops::negative(steps[i]));
      continue;
    }
    const Array& p = *params[i];
    updates.push_back(ops::subtract(ops::subtract(detail::decayed(name, p, decay, decays, lr), steps[i]), p));
  }
  return updates;
}

}  // namespace

void Adam::validate() const {
  check({kName, learning_rate, beta_1, beta_2, epsilon});
  detail::require_finite_nonnegative(kName, "weight_decay", weight_decay);
}

AdamState Adam::init_leaves(const Leaves& params) const {
  validate();
  return init_moments({kName, learning_rate, beta_1, beta_2, epsilon}, params);
}

std::vector<Array> Adam::update_leaves(const Leaves& grads, AdamState& state, const Leaves& params) const {
  validate();
  Array lr;
  std::vector<Array> steps = adam_steps({kName, learning_rate, beta_1, beta_2, epsilon}, grads, state, params, lr);
  return decoupled_updates(kName, steps, params, weight_decay, weight_decays, lr);
}

void AdamW::validate() const {
  check({kName, learning_rate, beta_1, beta_2, epsilon});
  detail::require_finite_nonnegative(kName, "weight_decay", weight_decay);
}

AdamState AdamW::init_leaves(const Leaves& params) const {
  validate();
  return init_moments({kName, learning_rate, beta_1, beta_2, epsilon}, params);
}

std::vector<Array> AdamW::update_leaves(const Leaves& grads, AdamState& state, const Leaves& params) const {
  validate();
  Array lr;
  std::vector<Array> steps = adam_steps({kName, learning_rate, beta_1, beta_2, epsilon}, grads, state, params, lr);
  return decoupled_updates(kName, steps, params, weight_decay, weight_decays, lr);
}

}  // namespace pmap::optim
