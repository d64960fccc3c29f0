// Adam and AdamW as Keras computes them (keras.optimizers.Adam / AdamW): the step size's bias correction is
// computed on the device from the state's step counter.
//
//   optim::Adam tx{.learning_rate = 1e-3f};
//   auto state = tx.init(params);
//   auto [updates, next] = tx.update(grads, std::move(state), params);
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

// The first and second moments, one f32 array per parameter leaf (tree order), and the steps taken:
// (1) i64 on the parameters' device.
struct AdamState {
  std::vector<Array> mu, nu;
  Array count;
};
PMAPCC_TREE(AdamState, mu, nu, count)

// With t = count + 1 and lr the schedule's rate at count (both on the device):
//   mu <- mu + (g - mu) * (1 - beta_1);  nu <- nu + (g^2 - nu) * (1 - beta_2)
//   updates = -((mu * alpha) / (sqrt(nu) + epsilon)),  alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
// epsilon is added to sqrt(nu) after the bias correction (Keras's "epsilon hat"; optax adds it to the
// corrected sqrt); 1 - beta and alpha are computed in double and rounded to float (kernels::adam_alpha).
// params + updates is p -= (mu alpha) / (sqrt(nu) + epsilon) in float bit for bit (tests/test_optim.cpp).
// beta_1, beta_2 in [0, 1); epsilon > 0; the rate finite and >= 0.
struct Adam {
  static constexpr const char* kName = "optim::Adam";
  static constexpr bool kElementwise = true;  // optim/base.h
  using State = AdamState;

  Schedule learning_rate = 1e-3f;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  float epsilon = 1e-7f;
  // Keras's Adam(weight_decay=...): decoupled decay as AdamW applies it (with AdamW's rounding), finite and
  // >= 0; 0 (the default): none, and the updates are Adam's formula's bits.
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

// Adam with decoupled weight decay as Keras's AdamW applies it: each parameter is first decayed with the
// step's rate, p1 = p - (p * weight_decay) * lr, then Adam's step is taken from p1, p2 = p1 - (mu alpha) /
// (sqrt(nu) + epsilon); the updates are p2 - p, rounded. params + updates is p2 (the in-place arithmetic's
// bits) wherever p2 - p is exact in float, which holds whenever p2 is within a factor 2 of p (Sterbenz);
// elsewhere (p changing sign, say: about 0.3% of elements in a first step at lr 0.05) no float u makes p + u
// round to p2 for every p, and params + updates is within one ulp of p2 - p of it. weight_decay finite and
// >= 0 (Keras's default); 0 without per-member values takes no decay at all: Adam's updates and bits (and
// an infinite parameter stays infinite, where p - (p * 0) * lr would make it NaN).
struct AdamW {
  static constexpr const char* kName = "optim::AdamW";
  static constexpr bool kElementwise = true;
  using State = AdamState;

  Schedule learning_rate = 1e-3f;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  float epsilon = 1e-7f;
  float weight_decay = 0.004f;
  // Per-member values replacing weight_decay (optim/base.h's inject); null: none.
  std::shared_ptr<const Array> weight_decays = nullptr;

  template <class P> State init(const P& params) const { return detail::init_tree(*this, params); }
  template <class P> std::pair<P, State> update(const P& grads, const State& state, const P& params) const {
    return detail::update_tree(*this, grads, state, params);
  }

  State init_leaves(const Leaves& params) const;
  std::vector<Array> update_leaves(const Leaves& grads, State& state, const Leaves& params) const;
  void validate() const;
  // Per-member hyper-parameters (optim/base.h): "learning_rate" (the schedule's bases), "weight_decay".
  bool inject(std::string_view name, const std::shared_ptr<const Array>& values) {
    auto* field = name == "learning_rate" ? &learning_rate.bases : name == "weight_decay" ? &weight_decays : nullptr;
    if (field == nullptr) return false;
    if (values) *field = values;
    return true;
  }
};

}  // namespace pmap::optim
