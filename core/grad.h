// grad and value_and_grad: JAX's reverse-mode transformations of a C++ function of trees of Arrays
// (pmap/tree.h: PMAPCC_TREE structs, vectors, maps, tuples) built from pmap::ops and the collectives.
//
//   auto loss_fn = [&](const Params& p, const Array& x, const Array& labels) {
//     return ops::softmax_cross_entropy(model(p, x), labels);
//   };
//   auto [loss, grads] = pmap::value_and_grad(loss_fn, "loss_fn")(params, x, labels);   // grads: Params
//   auto [values, g] = pmap::value_and_grad<0, 1>(f)(a, b);   // g: std::tuple<A, B>
//
// - The function returns a scalar f32 Array (shape ()), or a std::pair<Array, Aux> of the scalar and an
//   auxiliary tree (JAX's has_aux, decided here by the type): value_and_grad then returns
//   ((value, aux), grads) and grad returns (grads, aux).
// - Argnums (template arguments, default 0) pick the arguments differentiated; their f32 leaves are, and the
//   gradient has the argument's type (scalar leaves 0, an f32 leaf nothing flowed to zeros). An argument
//   differentiated with a leaf that is not f32 (labels) raises ValueError naming the leaf; pass it as an
//   argument not differentiated.
// - Eager: the function runs once, every op at once, recorded; the backward pass then runs each primitive's
//   VJP in reverse order, on the same devices (inside pmap: on each device, SPMD). Values computed inside
//   live until the call returns; the results are copied out. The same inputs give the same bits.
// - Inside the function, Array::reshape (&&) and the *_inplace collectives of a traced value raise
//   ValueError (use ops::reshape and the collectives that return new arrays); Array::to() and host reads
//   give plain values the gradient does not follow. grad inside a differentiated function (higher order)
//   raises NotAvailable.
//
// Collectives inside a differentiated function, on this device's function, as JAX's shard_map transposes
// them (this device's cotangent is transposed; nothing is implied for other devices):
//   psum(x)           the result is the same on every device (replicated): x's cotangent is the result's,
//                     unchanged. A replicated loss of psum'd partial products (a model-parallel layer)
//                     gives each device its own shard's gradient of the unsplit model.
//   pmean(x)          the result's cotangent / n.
//   all_gather(x)     psum_scatter of the cotangent (tiled as gathered; axis 0 only for now): each device's
//                     cotangent for the gathered whole is its own contribution, and they are summed.
//   psum_scatter(x)   all_gather of the cotangent (tiled as scattered).
//   ppermute(x, perm) ppermute of the cotangent by the inverse permutation.
//   all_to_all(x, split_axis, concat_axis)  all_to_all of the cotangent with split and concat swapped
//                     (tiled as exchanged): each chunk's cotangent goes back to the device it came from.
//   pmax, pmin        not differentiable (NotAvailable), as in JAX.
// A gradient with respect to a value replicated over an axis but used on each device with that device's
// data (the parameters of data parallelism) is this device's part: average it with pmean (or psum it), as
// the data-parallel step does.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/error.h>
#include <pmap/tree.h>

#include <pmapcc/core/trace.h>

namespace pmap {
namespace grad_detail {

template <class T> struct is_pair : std::false_type {};
template <class A, class B> struct is_pair<std::pair<A, B>> : std::true_type {};

template <std::size_t I, std::size_t... Nums> constexpr bool differentiated() {
  if constexpr (sizeof...(Nums) == 0) {
    return I == 0;
  } else {
    return ((I == Nums) || ...);
  }
}

template <bool Diff, class T> struct Arg;
template <class T> struct Arg<true, T> {
  T value;
  const T& get() const { return value; }
};
template <class T> struct Arg<false, T> {
  const T& value;
  const T& get() const { return value; }
};

// The argument's tree with its f32 leaves replaced by traced views (named for errors by their paths).
template <class T> T traced_tree(core::Trace& trace, const T& tree, std::size_t argnum) {
  std::vector<std::string> paths;
  tree_for_each_with_path(tree, [&](const std::string& path, const auto&) { paths.push_back(path); });
  std::size_t k = 0;
  return tree_map(tree, [&](const auto& leaf) {
    const std::string& path = paths[k++];
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return trace.input(leaf, "argument " + std::to_string(argnum) + (path.empty() ? "" : ", leaf '" + path + "'"));
    } else {
      return leaf;
    }
  });
}

template <class T> T gradient_tree(core::Trace& trace, const T& traced) {
  return tree_map(traced, [&](const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<L, Array>) {
      return trace.gradient(leaf);
    } else {
      return L{};
    }
  });
}

template <class R> const Array& value_of(const R& r) {
  if constexpr (std::is_same_v<R, Array>) {
    return r;
  } else {
    static_assert(is_pair<R>::value && std::is_same_v<typename R::first_type, Array>,
                  "a differentiated function returns an Array, or a std::pair<Array, Aux> (has_aux)");
    return r.first;
  }
}

void check_value(const std::string& function, const Array& value);  // core/grad.cpp

// The auxiliary result made independent of the trace: before the backward pass, which may write over values
// it has spent (Primitive::masking_input).
template <class R> void release_aux(const core::Trace& trace, R& r) {
  if constexpr (!std::is_same_v<R, Array>) {
    tree_for_each(r.second, [&](auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) trace.release(leaf);
    });
  }
}
// ... and the value, after it.
template <class R> void release_value(const core::Trace& trace, R& r) {
  if constexpr (std::is_same_v<R, Array>) {
    trace.release(r);
  } else {
    trace.release(r.first);
  }
}

// Runs f on args with the argnums traced; returns (f's result, the gradients).
template <std::size_t... Nums, class F, class... Args>
auto value_and_grad_call(const F& f, const std::string& function, const Args&... args) {
  static_assert(((Nums < sizeof...(Args)) && ...), "an argnum is not an argument of the function");
  core::Trace trace(function);
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    std::tuple<Arg<differentiated<I, Nums...>(), Args>...> held{[&]() -> Arg<differentiated<I, Nums...>(), Args> {
      if constexpr (differentiated<I, Nums...>()) {
        return {traced_tree(trace, args, I)};
      } else {
        return {args};
      }
    }()...};
    auto result = f(std::get<I>(held).get()...);
    check_value(function, value_of(result));
    release_aux(trace, result);
    trace.backward(value_of(result));
    auto grads = [&] {
      if constexpr (sizeof...(Nums) <= 1) {
        constexpr std::size_t n = (0 + ... + Nums);
        return gradient_tree(trace, std::get<n>(held).get());
      } else {
        return std::make_tuple(gradient_tree(trace, std::get<Nums>(held).get())...);
      }
    }();
    release_value(trace, result);
    return std::make_pair(std::move(result), std::move(grads));
  }(std::index_sequence_for<Args...>{});
}

}  // namespace grad_detail

// value_and_grad(f, name)(args...) -> (f(args...), gradients of the argnums): see above. `name` names f in
// errors.
template <std::size_t... Argnums, class F> auto value_and_grad(F f, std::string name = "the function") {
  return [f = std::move(f), name = std::move(name)](const auto&... args) {
    return grad_detail::value_and_grad_call<Argnums...>(f, name, args...);
  };
}

// grad(f, name)(args...) -> the gradients; with an auxiliary result, (gradients, aux).
template <std::size_t... Argnums, class F> auto grad(F f, std::string name = "the function") {
  return [f = std::move(f), name = std::move(name)](const auto&... args) {
    auto [result, grads] = grad_detail::value_and_grad_call<Argnums...>(f, name, args...);
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(result)>, Array>) {
      return std::move(grads);
    } else {
      return std::make_pair(std::move(grads), std::move(result.second));
    }
  };
}

}  // namespace pmap
