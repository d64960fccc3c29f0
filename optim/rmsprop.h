// RMSprop as Keras computes it (keras.optimizers.RMSprop, centered=False), with optional momentum; the
// learning rate's schedule is evaluated on the device from the state's step counter.
//
//   optim::RmsProp tx{.learning_rate = 1e-3f, .momentum = 0.9f};
#pragma once

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/tree.h>

#include <pmapcc/optim/base.h>
#include <pmapcc/optim/schedules.h>

namespace pmap::optim {

// The mean square, one f32 array per parameter leaf (tree order); the momentum trace (as many, or none when
// momentum is 0); the steps taken: (1) i64 on the parameters' device.
struct RmsPropState {
  std::vector<Array> nu, trace;
  Array count;
};
PMAPCC_TREE(RmsPropState, nu, trace, count)

// Keras's arithmetic, in float and in this order, with lr the schedule's rate at count:
//   nu <- rho * nu + (1 - rho) * g^2
//   increment = (lr * g) / sqrt(nu + epsilon)           (epsilon inside the root, as Keras; optax adds it
//                                                        outside: sqrt(nu) + eps)
//   momentum > 0: trace <- momentum * trace + increment; updates = -trace
//   else:         updates = -increment
// rho is a double; rho and 1 - rho are rounded to float once. rho in [0, 1); epsilon > 0; momentum finite
// and >= 0; the rate finite and >= 0. Keras's defaults.
struct RmsProp {
  static constexpr const char* kName = "optim::RmsProp";
  static constexpr bool kElementwise = true;  // optim/base.h
  using State = RmsPropState;

  Schedule learning_rate = 1e-3f;
  double rho = 0.9;
  float momentum = 0.0f;
  float epsilon = 1e-7f;

  template <class P> State init(const P& params) const { return detail::init_tree(*this, params); }
  template <class P> std::pair<P, State> update(const P& grads, const State& state, const P& params) const {
    return detail::update_tree(*this, grads, state, params);
  }

  // The leaf forms (optim/base.h), what chain composes. ValueError naming the field for a bad one.
  State init_leaves(const Leaves& params) const;
  std::vector<Array> update_leaves(const Leaves& grads, State& state, const Leaves& params) const;
  void validate() const;
  // Per-member hyper-parameters (optim/base.h): "learning_rate" (the schedule's bases).
  bool inject(std::string_view name, const std::shared_ptr<const Array>& values) {
    if (name != "learning_rate") return false;
    if (values) learning_rate.bases = values;
    return true;
  }
};

}  // namespace pmap::optim
