// Gradient transformations that compose (optax's): clip_by_global_norm, add_decayed_weights, and chain,
// which runs transformations in order, each one's updates the next one's gradients.
//
//   auto tx = optim::chain(optim::clip_by_global_norm(1.0f), optim::Adam{.learning_rate = 1e-3f});
//   auto state = tx.init(params);                            // std::tuple<EmptyState, AdamState>
//   auto [updates, next] = tx.update(grads, std::move(state), params);
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/mesh.h>
#include <pmap/tree.h>

#include <pmapcc/optim/base.h>

namespace pmap::optim {

// The state of a transformation that keeps none: a tree without leaves (optax.EmptyState).
using EmptyState = std::tuple<>;

// optax.clip_by_global_norm: g * min(1, max_norm / ||g||), ||g|| the norm of all the gradients' leaves
// together (their squares summed in double, leaf by leaf in tree order), the factor computed on the device
// in double and rounded to float (the Trainer's clipping: kernels::clip_scale, bit for bit). max_norm > 0.
struct ClipByGlobalNorm {
  static constexpr const char* kName = "optim::clip_by_global_norm";
  static constexpr bool kElementwise = false;  // the norm is over every leaf together
  using State = EmptyState;

  float max_norm = 1.0f;

  template <class P> State init(const P& params) const { return detail::init_tree(*this, params); }
  template <class P> std::pair<P, State> update(const P& grads, const State& state, const P& params) const {
    return detail::update_tree(*this, grads, state, params);
  }
  State init_leaves(const Leaves& params) const;
  std::vector<Array> update_leaves(const Leaves& grads, State& state, const Leaves& params) const;
  void validate() const;
};
ClipByGlobalNorm clip_by_global_norm(float max_norm);  // checked at once (ValueError naming max_norm)

// While it lives on the calling thread, clip_by_global_norm takes the norm of gradients some of whose leaves are
// blocks of tensors split over mesh axes (tensor parallelism, inside pmap): split[i] the axes of leaf i (tree
// order; empty: whole on every device). The blocks' squares are psum'd over their axes before the whole leaves'
// are added, so every device clips by the unsplit model's norm. The Trainer's step opens one around each
// member's update when its layout splits parameters. A clip of another leaf count under it: ValueError.
class SplitLeaves {
 public:
  explicit SplitLeaves(std::vector<AxisNames> split);
  ~SplitLeaves();
  SplitLeaves(const SplitLeaves&) = delete;
  SplitLeaves& operator=(const SplitLeaves&) = delete;
  // The innermost one's axes on this thread, or nullptr.
  static const std::vector<AxisNames>* current();

 private:
  std::vector<AxisNames> split_;
  const std::vector<AxisNames>* previous_;
};

// optax.add_decayed_weights: g + weight_decay * p (in float, p * weight_decay then the sum). Before an
// optimizer it is L2 regularization (coupled decay); after scale-like steps it is decoupled decay.
// weight_decay finite and >= 0.
struct AddDecayedWeights {
  static constexpr const char* kName = "optim::add_decayed_weights";
  static constexpr bool kElementwise = true;
  using State = EmptyState;

  float weight_decay = 0.0f;
  // Per-member values replacing weight_decay (optim/base.h's inject); null: none.
  std::shared_ptr<const Array> weight_decays = nullptr;

  template <class P> State init(const P& params) const { return detail::init_tree(*this, params); }
  template <class P> std::pair<P, State> update(const P& grads, const State& state, const P& params) const {
    return detail::update_tree(*this, grads, state, params);
  }
  State init_leaves(const Leaves& params) const;
  std::vector<Array> update_leaves(const Leaves& grads, State& state, const Leaves& params) const;
  void validate() const;
  // Per-member hyper-parameters (optim/base.h): "weight_decay".
  bool inject(std::string_view name, const std::shared_ptr<const Array>& values) {
    if (name != "weight_decay") return false;
    if (values) weight_decays = values;
    return true;
  }
};
AddDecayedWeights add_decayed_weights(float weight_decay);  // checked at once (ValueError naming it)

// optax.chain: the transformations in order; the state is the std::tuple of theirs (a tree: pmap
// replicates, gathers and checkpoints it, paths "0/...", "1/...").
template <class... Txs> struct Chain {
  static_assert(sizeof...(Txs) >= 1, "optim::chain needs at least one transformation");
  static constexpr const char* kName = "optim::chain";
  static constexpr bool kElementwise = (is_elementwise<Txs>() && ...);
  using State = std::tuple<typename Txs::State...>;

  std::tuple<Txs...> transforms;

  template <class P> State init(const P& params) const { return detail::init_tree(*this, params); }
  template <class P> std::pair<P, State> update(const P& grads, const State& state, const P& params) const {
    return detail::update_tree(*this, grads, state, params);
  }

  State init_leaves(const Leaves& params) const {
    return std::apply([&](const auto&... tx) { return State{tx.init_leaves(params)...}; }, transforms);
  }

  std::vector<Array> update_leaves(const Leaves& grads, State& state, const Leaves& params) const {
    Leaves in = grads;
    std::vector<Array> held;  // the previous transformation's updates, which `in` points into
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((held = std::get<I>(transforms).update_leaves(in, std::get<I>(state), params), in = detail::pointers(held)),
       ...);
    }(std::index_sequence_for<Txs...>{});
    return held;
  }

  // Per-member hyper-parameters (optim/base.h): given to the transformation of the chain that has `name`;
  // ValueError when several have it (chain(add_decayed_weights(...), AdamW{...}) and "weight_decay": which
  // one is meant is not clear).
  bool inject(std::string_view name, const std::shared_ptr<const Array>& values) {
    const int takers =
        std::apply([&](auto&... tx) { return (int{optim::inject(tx, name, values)} + ...); }, transforms);
    if (takers > 1)
      detail::ambiguous_hyperparam(kName, name, takers);
    return takers == 1;
  }
};

template <class... Txs> Chain<Txs...> chain(Txs... transforms) { return Chain<Txs...>{{std::move(transforms)...}}; }

}  // namespace pmap::optim
