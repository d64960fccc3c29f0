// What every transformation of pmap::optim shares: the Array leaves of a parameter tree, the step counter
// in device memory, the checks that name the optimizer and field, and apply_updates (optax's).
//
// A transformation Tx has `using State`, `State init(params)` and `std::pair<P, State> update(grads,
// state, params)`, written once over the leaves: `init_leaves` and `update_leaves` on the trees' f32 Array
// leaves in tree order (scalar leaves are not parameters: updates keep the grads' scalars, apply_updates
// the params'). A transformation whose every update element depends only on the same element of the grads,
// the state and the params (and on the step count) says so with `static constexpr bool kElementwise = true`:
// members stacked on a leading axis then step together as each would alone, with one count (the training
// layer relies on it; clip_by_global_norm is not one). The step's arithmetic runs on the parameters' device,
// on CPU devices at once and on CUDA devices inside pmap (the rules of pmapcc/kernels/eager/array_ops.h); nothing
// reads a value back to the host.
// update reads the state it is given and returns a new one (optax's pure functions): a const state works,
// as inside a jitted step.
// Per-member hyper-parameters (a hyper-parameter ensemble, optax.inject_hyperparams' use under vmap): a
// transformation that takes them has `bool inject(std::string_view name, const std::shared_ptr<const
// Array>& values)`, which sets the hyper-parameter `name` ("learning_rate", "weight_decay") of this copy to
// `values`, f32 with one value per member of the leaves' leading (stacked member) axis, or one value, on the
// parameters' device, and says whether it has that hyper-parameter (null `values` only asks). The copy
// shares `values` (a view inside it must outlive the copy). They replace the field's float in the
// arithmetic, element for element the bits the float would give; the values are not checked (they stay on
// the device: the caller checks them) and a learning rate is not differentiated (the schedule is computed
// eagerly). The training layer keeps them in its state and injects them into a copy of the transformation
// at each step.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/error.h>
#include <pmap/tree.h>

#include <pmapcc/core/ops.h>
#include <pmapcc/core/vmap.h>

namespace pmap::optim {

using Leaves = std::vector<const Array*>;

// Whether Tx says it is element by element (kElementwise above); false when it does not say.
template <class Tx> constexpr bool is_elementwise() {
  if constexpr (requires { Tx::kElementwise; }) {
    return Tx::kElementwise;
  } else {
    return false;
  }
}

// Sets tx's hyper-parameter `name` to per-member `values` (see above) and says whether tx has it: false for a
// transformation without inject.
template <class Tx> bool inject(Tx& tx, std::string_view name, const std::shared_ptr<const Array>& values) {
  if constexpr (requires { { tx.inject(name, values) } -> std::convertible_to<bool>; }) {
    return tx.inject(name, values);
  } else {
    return false;
  }
}

namespace detail {
// v (one value, or one per member) against a leaf `like` whose leading axis holds the members: v itself when
// it is one value, else v repeated along like's other axes (like's shape), so that an element-by-element op
// of like and the result gives row m v[m]. ShapeError naming fn when v has neither one value nor like's
// leading size.
Array per_member(const char* fn, const Array& v, const Array& like);
// ShapeError naming fn unless v has one value or like's leading size (per_member's check, without the copy).
void check_per_member(const char* fn, const Array& v, const Array& like);
// Decoupled weight decay as Keras applies it before an optimizer's step: p - (p * wd) * lr, with wd the
// per-member values `decays` when set (one per row of p's leading axis), else `decay`; lr one value or one per
// member. The single-value and per-member forms give the same bits for the same values.
Array decayed(const char* fn, const Array& p, float decay, const std::shared_ptr<const Array>& decays,
              const Array& lr);
// ValueError: `takers` transformations of `chain` have the hyper-parameter `name`.
[[noreturn]] void ambiguous_hyperparam(const char* chain, std::string_view name, int takers);
// Each f32 Array leaf of a tree, in tree order (scalar leaves are not parameters).
template <class T> Leaves leaves(const T& tree) {
  Leaves out;
  tree_for_each(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) out.push_back(&leaf);
  });
  return out;
}
inline Leaves pointers(const std::vector<Array>& v) {
  Leaves out;
  for (const Array& a : v) out.push_back(&a);
  return out;
}
// A tree of t's type whose Array leaves are `values` in order (scalar leaves kept).
template <class T> T with_leaves(const T& t, std::vector<Array>& values) {
  std::size_t k = 0;
  return tree_map(t, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return std::move(values.at(k++));
    } else {
      return leaf;
    }
  });
}
// ShapeError naming fn when a and b differ in leaf count (trees of different structure), a leaf's shape or
// dtype; ValueError when a leaf is an empty handle or not f32.
void check_same(const char* fn, const Leaves& a, const char* an, const Leaves& b, const char* bn);
// The device of the parameters (all on one, f32, at least one leaf: ValueError naming fn otherwise).
Device params_device(const char* fn, const Leaves& params);
// Zeros (f32) of each leaf's shape on its device: a moment's initial value.
std::vector<Array> zeros_like(const Leaves& params);
// The step counter: (1) i64 zero on the parameters' device, and its check (ValueError naming fn).
Array zero_count(const char* fn, const Leaves& params);
void check_count(const char* fn, const Array& count, const Leaves& params);
// ValueError "<who>: <field> must be ..., got <v>" unless the check holds.
void require_finite_nonnegative(const char* who, const char* field, double v);
void require_positive(const char* who, const char* field, double v);
void require_unit_interval(const char* who, const char* field, double v);  // [0, 1)

// The tree form of a transformation's leaf functions.
template <class Tx, class P> typename Tx::State init_tree(const Tx& tx, const P& params) {
  return tx.init_leaves(leaves(params));
}
// The state is read, never written: update_leaves works on views of its leaves and replaces each leaf it
// updates with a new array; a leaf it leaves as it was is copied, so the new state owns all its storage.
template <class Tx, class P>
std::pair<P, typename Tx::State> update_tree(const Tx& tx, const P& grads, const typename Tx::State& state,
                                             const P& params) {
  const Leaves g = leaves(grads), p = leaves(params);
  check_same((std::string(Tx::kName) + "::update").c_str(), g, "grads", p, "params");
  typename Tx::State next = tree_map(state, [](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return vmap_detail::alias(leaf);
    } else {
      return leaf;
    }
  });
  std::vector<Array> updates = tx.update_leaves(g, next, p);
  tree_for_each(next, [](auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      if (leaf.valid() && !leaf.owns_data()) leaf = ops::copy(leaf);  // (queued: a graph capture takes it)
    }
  });
  return {with_leaves(grads, updates), std::move(next)};
}
}  // namespace detail

// params + updates, leaf by leaf, new arrays (optax.apply_updates); scalar leaves are params'.
template <class P> P apply_updates(const P& params, const P& updates) {
  const Leaves p = detail::leaves(params), u = detail::leaves(updates);
  detail::check_same("optim::apply_updates", p, "params", u, "updates");
  std::vector<Array> out;
  for (std::size_t i = 0; i < p.size(); ++i) out.push_back(ops::add(*p[i], *u[i]));
  return detail::with_leaves(params, out);
}

}  // namespace pmap::optim
