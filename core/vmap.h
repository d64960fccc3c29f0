// vmap: JAX's vectorizing map of a C++ function of trees of Arrays built from pmap::ops and the collectives.
//
//   auto step = pmap::vmap(apply_model, {0, pmap::none, pmap::none}, "apply_model");
//   auto [loss_and_logits, grads] = step(states, images, labels);   // states' leaves (M, ...): M members
//
// - in_axes: per argument, 0 (mapped: every Array leaf is stacked over the members along axis 0, all of the
//   same length M) or pmap::none (every member reads the same value). Left out: every argument mapped.
// - The function runs once. It sees one member's view of each mapped leaf (its shape without axis 0) and
//   the unmapped arguments as given; each op on a member's view is its primitive's batching rule over all
//   M members at once (pmapcc/core/primitive.h), one kernel call for the members where the kernels take a
//   member count (linear, conv2d) or a leading axis changes nothing (element-wise ops, pooling, softmax),
//   else member by member on views of each member's part.
// - The result is the function's, each Array leaf stacked over the members (out_axes 0); a leaf that does
//   not depend on a mapped argument is repeated M times.
// - A member's view has no storage of its own: reading it (item(), to_vector(), to()), writing it, or an
//   eager kernel call on it (pmap::ops::eager, the optimizers' eager helpers) raises ValueError; return it
//   and read the stacked result. A view kept after vmap returns raises when used.
// - Composes with grad: vmap(value_and_grad(f)) gives each member the gradient of its own value (JAX's
//   per-example gradients), grad(vmap(f)) differentiates through the batched call; inside pmap, the
//   collectives over a pmap axis combine each member with the same member of the other devices.
// - Not yet: vmap inside vmap (NotAvailable), in_axes other than 0, out_axes other than 0.
// map(f, batch_size, in_axes, name) (below): the same results, batch_size members at a time (jax.lax.map).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/detail/trace.h>
#include <pmap/error.h>
#include <pmap/partition.h>
#include <pmap/tree.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/ops.h>

namespace pmap {

// vmap's in_axes: 0 (mapped) or none (pmap/partition.h: read by every member).
using InAxes = std::vector<std::optional<int>>;

namespace vmap_detail {

// Checks in_axes against the function's arity (an empty list maps every argument); whether argument i is mapped.
std::vector<bool> mapped_arguments(const std::string& function, const InAxes& in_axes, std::size_t arity);
// A view of x's storage that keeps its tag (a value grad traces stays traced).
Array alias(const Array& x);

// Every Array leaf of a mapped argument: its length along axis 0, which must agree.
template <class T>
void count_members(const std::string& function, const T& tree, std::size_t argnum, std::int64_t& members,
                   std::string& first) {
  tree_for_each_with_path(tree, [&](const std::string& path, const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      const std::string where = "argument " + std::to_string(argnum) + (path.empty() ? "" : ", leaf '" + path + "'");
      if (!leaf.valid()) throw ValueError("vmap of '" + function + "': " + where + " is an empty Array handle");
      if (leaf.ndim() == 0) {
        throw ValueError("vmap of '" + function + "': " + where + " is " + leaf.signature() +
                         ", which has no axis 0 to map over (give the argument in_axes none)");
      }
      if (members < 0) {
        members = leaf.dim(0);
        first = where;
      } else if (leaf.dim(0) != members) {
        throw ValueError("vmap of '" + function + "': " + where + " has " + std::to_string(leaf.dim(0)) +
                         " along axis 0 but " + first + " has " + std::to_string(members) +
                         "; every mapped leaf must have the same number of members");
      }
    }
  });
}

template <class T> T member_tree(core::BatchLevel& level, const T& tree) {
  return tree_map(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return level.wrap(alias(leaf));
    } else {
      return leaf;
    }
  });
}

Array stacked_leaf(core::BatchLevel& level, const Array& leaf);  // core/vmap.cpp
// Members [first, first + count) of a mapped leaf: a view of its storage when no transformation traces it, else
// ops::slice (differentiable). Inside vmap: NotAvailable (core/vmap.cpp).
Array members_part(const std::string& function, const Array& leaf, std::int64_t first, std::int64_t count);
// The batches' leaves joined along axis 0, in order: ops::concatenate where grad traces one (differentiable),
// else the backend's copies (any dtype); an empty leaf stays empty.
Array joined_members(const std::vector<const Array*>& parts);

template <class T> T members_tree(const std::string& function, const T& tree, std::int64_t first, std::int64_t count) {
  return tree_map(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return members_part(function, leaf, first, count);
    } else {
      return leaf;
    }
  });
}

// A mapped argument's batch (held), or an unmapped one as given (pointed to).
template <class T> struct Part {
  std::optional<T> value;
  const T* given = nullptr;
  const T& get() const { return value ? *value : *given; }
};

template <class R> R stacked_result(core::BatchLevel& level, const R& result) {
  return tree_map(result, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return stacked_leaf(level, leaf);
    } else {
      return leaf;
    }
  });
}

template <class T> struct Held {
  T value;
  const T& get() const { return value; }
};

// An unmapped argument, its Arrays aliased (the function reads them as given).
template <class T> T aliased(const T& tree) {
  return tree_map(tree, [](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return alias(leaf);
    } else {
      return leaf;
    }
  });
}

// Trees of one structure joined leaf by leaf: join(the trees' k-th Arrays, tree 0's leaf) for every Array leaf;
// other leaves are tree 0's. Trees with different numbers of Arrays: ValueError naming `function`.
template <class T, class J> T join_trees(const std::string& function, const std::vector<T>& trees, J&& join) {
  std::vector<std::vector<const Array*>> leaves(trees.size());
  for (std::size_t t = 0; t < trees.size(); ++t) {
    tree_for_each(trees[t], [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) leaves[t].push_back(&leaf);
    });
    if (leaves[t].size() != leaves[0].size()) {
      throw ValueError(function + ": tree " + std::to_string(t) + " has " + std::to_string(leaves[t].size()) +
                       " arrays, tree 0 has " + std::to_string(leaves[0].size()));
    }
  }
  std::size_t k = 0;
  return tree_map(trees.at(0), [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      std::vector<const Array*> column;
      for (const auto& l : leaves) column.push_back(l[k]);
      ++k;
      return join(column, leaf);
    } else {
      return leaf;
    }
  });
}

// The members of the mapped arguments' leaves (checked to agree); -1 when no mapped argument holds an Array.
template <class... A>
std::int64_t mapped_members(const std::string& function, const std::vector<bool>& mapped, const A&... args) {
  std::int64_t members = -1;
  std::string first;
  std::size_t argnum = 0;
  ((mapped[argnum] ? count_members(function, args, argnum, members, first) : void(), ++argnum), ...);
  return members;
}

}  // namespace vmap_detail

// Trees of one structure stacked leaf by leaf along a new leading axis (jax.tree.map(jnp.stack, *trees)):
// the mapped form of several members' values, on their leaves' device. Scalar leaves are the first tree's.
// No trees, or trees whose structures or leaf shapes differ: ValueError / ShapeError.
template <class T> T stack_trees(const std::vector<T>& trees) {
  if (trees.empty()) throw ValueError("stack_trees: no trees to stack");
  return vmap_detail::join_trees("stack_trees", trees, [](const std::vector<const Array*>& parts, const Array& leaf) {
    return concatenate(parts, leaf.device(), /*stacked=*/true);
  });
}

// vmap(f, in_axes, name)(args...) -> f's result stacked over the members: see above. `name` names f in errors.
template <class F> auto vmap(F f, InAxes in_axes = {}, std::string name = "the function") {
  return [f = std::move(f), in_axes = std::move(in_axes), name = std::move(name)](const auto&... args) {
    const std::vector<bool> mapped = vmap_detail::mapped_arguments(name, in_axes, sizeof...(args));
    const std::int64_t members = vmap_detail::mapped_members(name, mapped, args...);
    if (members < 0) throw ValueError("vmap of '" + name + "': no mapped argument holds an Array");
    core::BatchLevel level(name, members);
    std::size_t i = 0;
    std::tuple<vmap_detail::Held<std::remove_cvref_t<decltype(args)>>...> held{
        [&]() -> vmap_detail::Held<std::remove_cvref_t<decltype(args)>> {
          const bool m = mapped[i++];
          return {m ? vmap_detail::member_tree(level, args) : vmap_detail::aliased(args)};
        }()...};
    auto result = std::apply([&](const auto&... h) { return f(h.get()...); }, held);
    return vmap_detail::stacked_result(level, result);
  };
}

// map(f, batch_size, in_axes, name)(args...) -> vmap(f, in_axes, name)(args...)'s values, computed
// batch_size members at a time (jax.lax.map's batch_size): each batch one vmap of f over its members' part
// of the mapped leaves, the batches' results joined along axis 0 in member order, on their device. A part is
// a view of the caller's storage (no copy) unless grad traces the leaf (then ops::slice, so grad(map(f))
// differentiates through it: vmap's gradients up to a zero's sign and the order in which an unmapped
// argument's gradient is summed, each batch's slice adding a zero-padded cotangent). The values are vmap's
// bits wherever a kernel computes a member alone as it does in a batch (every CPU kernel does). Why: one
// vmap runs each layer for every member before the next, so on CPU devices the members' activations
// together can outgrow the caches; batches of one run a member's layers back to back, as the Trainer runs a
// CPU device's members. Inside pmap each batch runs f's collectives on its own: give every device the same
// batch_size. batch_size >= the members: one vmap. batch_size < 1: ValueError; misuse: vmap's errors.
template <class F> auto map(F f, std::int64_t batch_size, InAxes in_axes = {}, std::string name = "the function") {
  auto batch = vmap(std::move(f), in_axes, name);
  return [batch = std::move(batch), batch_size, in_axes = std::move(in_axes),
          name = std::move(name)](const auto&... args) {
    if (batch_size < 1) {
      throw ValueError("map of '" + name + "': batch_size " + std::to_string(batch_size) + " must be at least 1");
    }
    const std::vector<bool> mapped = vmap_detail::mapped_arguments(name, in_axes, sizeof...(args));
    const std::int64_t members = vmap_detail::mapped_members(name, mapped, args...);
    if (members <= batch_size) return batch(args...);
    using R = decltype(batch(args...));
    std::vector<R> results;
    for (std::int64_t begin = 0; begin < members; begin += batch_size) {
      const std::int64_t count = std::min(batch_size, members - begin);
      std::size_t i = 0;
      std::tuple<vmap_detail::Part<std::remove_cvref_t<decltype(args)>>...> parts{
          [&]() -> vmap_detail::Part<std::remove_cvref_t<decltype(args)>> {
            if (mapped[i++]) return {vmap_detail::members_tree(name, args, begin, count), nullptr};
            return {std::nullopt, &args};
          }()...};
      results.push_back(std::apply([&](const auto&... p) { return batch(p.get()...); }, parts));
    }
    return vmap_detail::join_trees("map of '" + name + "'", results,
                                   [](const std::vector<const Array*>& parts, const Array&) {
                                     return vmap_detail::joined_members(parts);
                                   });
  };
}

}  // namespace pmap
