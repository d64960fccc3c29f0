// Optimizers as optax writes them: init(params) -> state; update(grads, state, params) -> (updates, new
// state); apply_updates(params, updates) -> new params. Parameters, gradients and updates are trees of f32
// Arrays of one type (a model's PMAPCC_TREE struct); the state is a tree too, so pmap replicates, shards,
// gathers and checkpoints it like the parameters. Each runs on the parameters' device with pmap::ops.
//
//   optim::Sgd tx{.learning_rate = 0.1f, .momentum = 0.9f};      // optax.sgd(0.1, momentum=0.9)
//   auto opt_state = tx.init(params);
//   auto [updates, next] = tx.update(grads, std::move(opt_state), params);
//   params = optim::apply_updates(params, updates);
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/error.h>
#include <pmap/tree.h>

#include <pmapcc/core/ops.h>

namespace pmap::optim {

// The momentum trace, one array per parameter leaf (tree order), and the steps taken.
struct SgdState {
  std::vector<Array> trace;
  std::int64_t count = 0;
};
PMAPCC_TREE(SgdState, trace, count)

namespace detail {
// Each f32 Array leaf of a tree, in tree order (scalar leaves are not parameters).
template <class T> std::vector<const Array*> leaves(const T& tree) {
  std::vector<const Array*> out;
  tree_for_each(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) out.push_back(&leaf);
  });
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
void check_same(const char* fn, const std::vector<const Array*>& a, const char* an, const std::vector<const Array*>& b,
                const char* bn);
}  // namespace detail

// optax.sgd: trace = momentum * trace + g; updates = -lr * (nesterov ? g + momentum * trace : trace)
// (momentum 0: -lr * g). The same arithmetic, in the same order, as mnist_ensemble's SGD.
struct Sgd {
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  bool nesterov = false;

  template <class P> SgdState init(const P& params) const {
    SgdState s;
    for (const Array* p : detail::leaves(params)) s.trace.push_back(Array(p->shape(), DType::f32, p->device()));
    return s;
  }

  template <class P> std::pair<P, SgdState> update(const P& grads, SgdState state, const P& params) const {
    const auto g = detail::leaves(grads);
    std::vector<const Array*> t;
    for (const Array& a : state.trace) t.push_back(&a);
    detail::check_same("optim::Sgd::update", g, "grads", detail::leaves(params), "params");
    detail::check_same("optim::Sgd::update", g, "grads", t, "the state's trace");
    std::vector<Array> updates;
    for (std::size_t i = 0; i < g.size(); ++i) {
      Array next = ops::add(ops::scale(state.trace[i], momentum), *g[i]);
      Array step = nesterov ? ops::add(*g[i], ops::scale(next, momentum)) : next.copy();
      updates.push_back(ops::scale(step, -learning_rate));
      state.trace[i] = std::move(next);
    }
    ++state.count;
    return {detail::with_leaves(grads, updates), std::move(state)};
  }
};

// params + updates, leaf by leaf (optax.apply_updates).
template <class P> P apply_updates(const P& params, const P& updates) {
  const auto p = detail::leaves(params), u = detail::leaves(updates);
  detail::check_same("optim::apply_updates", p, "params", u, "updates");
  std::vector<Array> out;
  for (std::size_t i = 0; i < p.size(); ++i) out.push_back(ops::add(*p[i], *u[i]));
  return detail::with_leaves(params, out);
}

}  // namespace pmap::optim
