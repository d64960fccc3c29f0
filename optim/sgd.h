// SGD with momentum and Nesterov (optax.sgd), the Trainer's arithmetic. Like every optimizer of
// pmap::optim: init(params) -> state; update(grads, state, params) -> (updates, new state);
// apply_updates(params, updates) -> new params. Parameters, gradients and updates are trees of f32 Arrays of
// one type (a model's PMAPCC_TREE struct); the state is a tree too, so pmap replicates, shards, gathers and
// checkpoints it like the parameters. Each runs on the parameters' device.
//
//   optim::Sgd tx{.learning_rate = 0.1f, .momentum = 0.9f};      // optax.sgd(0.1, momentum=0.9)
//   auto opt_state = tx.init(params);
//   auto [updates, next] = tx.update(grads, opt_state, params);   // opt_state is only read
//   params = optim::apply_updates(params, updates);
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

// The momentum trace, one f32 array per parameter leaf (tree order), and the steps taken: (1) i64 on the
// parameters' device.
struct SgdState {
  std::vector<Array> trace;
  Array count;
};
PMAPCC_TREE(SgdState, trace, count)

// optax.sgd: trace = momentum * trace + g; updates = -(lr * (nesterov ? g + momentum * trace : trace)), lr the
// schedule's rate at the state's count (computed on the device). params + updates equals
// optax's p -= lr * trace (Nesterov: lr * (g + momentum * trace)) in float bit for bit. momentum finite and >= 0.
struct Sgd {
  static constexpr const char* kName = "optim::Sgd";
  static constexpr bool kElementwise = true;  // optim/base.h
  using State = SgdState;

  Schedule learning_rate = 0.01f;
  float momentum = 0.0f;
  bool nesterov = false;
  // Keras's SGD(weight_decay=...): each parameter first decayed with the step's rate, p - (p * wd) * lr, then
  // the step taken from it; the updates are that minus p (AdamW's rounding, optim/adam.h). Finite and >= 0;
  // 0 (the default): none, and the updates are the kernel's (OptimizerOps::sgd_trace) bits.
  float weight_decay = 0.0f;
  std::shared_ptr<const Array> weight_decays = nullptr;  // per-member values replacing weight_decay; null: none

  template <class P> State init(const P& params) const { return detail::init_tree(*this, params); }
  template <class P> std::pair<P, State> update(const P& grads, const State& state, const P& params) const {
    return detail::update_tree(*this, grads, state, params);
  }

  // The leaf forms (optim/base.h), what chain composes. ValueError naming the field for a bad one.
  State init_leaves(const Leaves& params) const;
  std::vector<Array> update_leaves(const Leaves& grads, State& state, const Leaves& params) const;
  void validate() const;
  // Per-member hyper-parameters (optim/base.h): "learning_rate" (the schedule's bases), and "weight_decay"
  // when weight_decay is not 0 (a decaying transformation: without decay it leaves the per-member decay to
  // another transformation of a chain, such as add_decayed_weights).
  bool inject(std::string_view name, const std::shared_ptr<const Array>& values) {
    auto* field = name == "learning_rate"                          ? &learning_rate.bases
                  : name == "weight_decay" && weight_decay != 0.0f ? &weight_decays
                                                                   : nullptr;
    if (field == nullptr) return false;
    if (values) *field = values;
    return true;
  }
};

}  // namespace pmap::optim
