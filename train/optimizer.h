// Optimizer: any optax-style transformation of pmap::optim (Sgd, Adam, chain(clip_by_global_norm(1),
// AdamW{...}), a user's own) over Variables, behind one type, so the Trainer takes it as an input. Its state is
// Variables too, named for checkpoints: a leaf the transformation keeps per parameter is "<field>/<parameter>"
// ("trace/Conv_0/kernel", "1/mu/Dense_0/bias" inside a chain), any other by its path ("count").
//
//   train::Optimizer tx(optim::Sgd{.learning_rate = 0.1f, .momentum = 0.9f});
//   Variables opt = tx.init(params);
//   auto [updates, next] = tx.update(grads, opt, params);
#pragma once

#include <memory>
#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/error.h>
#include <pmap/tree.h>

#include <pmapcc/core/jit.h>
#include <pmapcc/optim/base.h>
#include <pmapcc/train/variables.h>

namespace pmap::train {

namespace detail {
// The Variables names of a state's leaves at `paths` (tree_for_each_with_path's, in order): a field's leaves
// "<...>/<field>/0" .. "/<n-1>" with n the parameters' count (a vector of per-parameter leaves, in the
// parameters' order) become "<...>/<field>/<names[i]>"; any other path stays as it is. Two leaves of one name:
// ValueError naming `optimizer` and the name.
std::vector<std::string> state_names(const std::vector<std::string>& paths, const std::vector<std::string>& names,
                                     const char* optimizer);
std::vector<std::string> names_of(const Variables& v);
// What an error about a missing per-member hyper-parameter `name` adds: for "weight_decay", that optim::Sgd
// and optim::Adam take it only when their own weight_decay is not 0.
std::string hyperparam_hint(std::string_view name);
}  // namespace detail

class Optimizer {
 public:
  template <class Tx> explicit Optimizer(Tx tx) : impl_(std::make_shared<Impl<Tx>>(std::move(tx))) {}

  const char* name() const { return impl_->name(); }  // the transformation's kName ("optim::Sgd")
  // Whether the transformation is element by element (its kElementwise, optim/base.h; false when it does not
  // say): a device's stacked members then take one update with one state, else one each.
  bool elementwise() const { return impl_->elementwise(); }
  // The initial state for `params` (on their device).
  Variables init(const Variables& params) const { return impl_->init(params); }
  // Whether the transformation takes the per-member hyper-parameter `name` ("learning_rate", "weight_decay":
  // optim/base.h's inject).
  bool has_hyperparam(std::string_view name) const { return impl_->has_hyperparam(name); }
  // (updates, new state); the state is read, not written (optax's pure update). ValueError naming the missing
  // or extra state tensor for a state of another optimizer or other parameters. `hyperparams`: per-member
  // values by hyper-parameter name (each f32, one per member of the leaves' leading axis, or one), injected
  // into a copy of the transformation for this update; ValueError naming one it does not take.
  std::pair<Variables, Variables> update(const Variables& grads, const Variables& state, const Variables& params,
                                         const Variables& hyperparams = {}) const {
    return impl_->update(grads, state, params, hyperparams);
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual const char* name() const = 0;
    virtual bool elementwise() const = 0;
    virtual Variables init(const Variables& params) const = 0;
    virtual bool has_hyperparam(std::string_view name) const = 0;
    virtual std::pair<Variables, Variables> update(const Variables& grads, const Variables& state,
                                                   const Variables& params, const Variables& hyperparams) const = 0;
  };

  template <class Tx> struct Impl final : Base {
    using State = typename Tx::State;
    explicit Impl(Tx t) : tx(std::move(t)) {}
    const char* name() const override { return Tx::kName; }
    bool elementwise() const override { return optim::is_elementwise<Tx>(); }

    Variables init(const Variables& params) const override {
      State s = tx.init(params);
      remember(s, params.size());
      return named(std::move(s), params);
    }

    bool has_hyperparam(std::string_view name) const override {
      Tx copy = tx;
      return optim::inject(copy, name, nullptr);
    }

    std::pair<Variables, Variables> update(const Variables& grads, const Variables& state, const Variables& params,
                                           const Variables& hyperparams) const override {
      State typed = unnamed(state, params);
      Tx injected = tx;  // this update's copy (none injected: tx's own values); views of the caller's values
      for (const auto& [name, values] : hyperparams) {
        if (!values.valid())
          throw ValueError(std::string(Tx::kName) + ": the per-member hyper-parameter '" + name + "' is empty");
        if (values.size() > 1)  // one per member: every leaf stacks that many (no leaf's own axis taken for it)
          for (const auto& [leaf, p] : params)
            if (p.ndim() == 0 || p.dim(0) != values.size())
              throw ShapeError(std::string(Tx::kName) + ": the per-member hyper-parameter '" + name + "' has " +
                               std::to_string(values.size()) + " values and parameter '" + leaf + "' is " +
                               p.signature() + "; each must stack as many members on its leading axis");
        if (!optim::inject(injected, name, std::make_shared<const Array>(vmap_detail::alias(values))))
          throw ValueError(std::string(Tx::kName) + " has no per-member hyper-parameter '" + name + "'" +
                           detail::hyperparam_hint(name));
      }
      auto [updates, next] = injected.update(grads, typed, params);
      return {std::move(updates), named(std::move(next), params)};
    }

    // The paths of the state's leaves, in order; a leaf that is not an Array is refused (the state is
    // variables, all of it kept between steps).
    static std::vector<std::string> paths_of(const State& s) {
      std::vector<std::string> paths;
      tree_for_each_with_path(s, [&](const std::string& path, const auto& leaf) {
        if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>)
          throw ValueError(std::string(Tx::kName) + ": state leaf '" + path + "' is not an Array");
        paths.push_back(path);
      });
      return paths;
    }

    // The state's leaves moved into Variables by their names.
    Variables named(State s, const Variables& params) const {
      const auto names = detail::state_names(paths_of(s), detail::names_of(params), Tx::kName);
      Variables out;
      std::size_t i = 0;
      tree_for_each(s, [&](auto& leaf) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>)
          out.emplace(names[i++], std::move(leaf));
      });
      return out;
    }

    // The typed state whose leaves are views of `state`'s tensors, by the names `named` gives them.
    State unnamed(const Variables& state, const Variables& params) const {
      State s = skeleton(params);
      const auto names = detail::state_names(paths_of(s), detail::names_of(params), Tx::kName);
      std::size_t i = 0;
      tree_for_each(s, [&](auto& leaf) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
          auto it = state.find(names[i]);
          if (it == state.end())
            throw ValueError(std::string(Tx::kName) + ": the optimizer state has no tensor '" + names[i] + "'");
          leaf = vmap_detail::alias(it->second);
          ++i;
        }
      });
      if (i != state.size()) {
        std::string extra;
        for (const auto& [name, a] : state)
          if (std::find(names.begin(), names.end(), name) == names.end())
            extra += (extra.empty() ? "'" : ", '") + name + "'";
        throw ValueError(std::string(Tx::kName) + ": the optimizer state has tensors this optimizer does not keep: " +
                         extra);
      }
      return s;
    }

    // The state's structure for params: its leaves empty, its vectors as long as init makes them (made by
    // init, or here by an init when this optimizer has not made one for as many parameters).
    State skeleton(const Variables& params) const {
      {
        std::lock_guard lock(mutex);
        if (shape_ && count_ == params.size()) return jit_detail::empty_leaves(*shape_);
      }
      State made = jit_detail::empty_leaves(tx.init(params));
      remember(made, params.size());
      return made;
    }
    void remember(const State& s, std::size_t params) const {
      State shape = jit_detail::empty_leaves(s);
      std::lock_guard lock(mutex);
      shape_ = std::move(shape);
      count_ = params;
    }

    Tx tx;
    mutable std::mutex mutex;
    mutable std::optional<State> shape_;
    mutable std::size_t count_ = 0;
  };

  std::shared_ptr<const Base> impl_;
};

}  // namespace pmap::train
