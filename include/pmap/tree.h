// Trees of Arrays, JAX's pytrees in C++: a leaf is an Array or an arithmetic scalar; containers are
// std::vector, std::array, std::tuple, std::pair, std::map and structs that declare their fields once with
// PMAPCC_TREE(Type, field, ...). Leaves are visited in one fixed order: containers in element order,
// maps in key order, structs in declaration order.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/array.h>

namespace pmap {

template <class T> concept ScalarLeaf = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;
template <class T> concept Leaf = std::is_same_v<T, Array> || ScalarLeaf<T>;

namespace detail {

template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_std_array : std::false_type {};
template <class T, std::size_t N> struct is_std_array<std::array<T, N>> : std::true_type {};
template <class T> struct is_tuple : std::false_type {};
template <class... Ts> struct is_tuple<std::tuple<Ts...>> : std::true_type {};
template <class T> struct is_pair : std::false_type {};
template <class A, class B> struct is_pair<std::pair<A, B>> : std::true_type {};
template <class T> struct is_map : std::false_type {};
template <class K, class V, class C, class A> struct is_map<std::map<K, V, C, A>> : std::true_type {};

template <class T> concept HasTreeFields = requires(T& t) { pmapcc_tree_fields(t); };

template <class> inline constexpr bool always_false = false;

template <class K> std::string key_str(const K& k) {
  if constexpr (std::is_convertible_v<const K&, std::string_view>) {
    return std::string(std::string_view(k));
  } else {
    return std::to_string(k);
  }
}

// Splits "a, b, c" (the stringified field list of PMAPCC_TREE) into names.
std::vector<std::string> split_field_names(std::string_view list);

template <class T, class F> void for_each_with_path(T&& t, const std::string& path, F& f) {
  using U = std::remove_cvref_t<T>;
  auto join = [&](const std::string& part) { return path.empty() ? part : path + "/" + part; };
  if constexpr (Leaf<U>) {
    f(path, t);
  } else if constexpr (is_vector<U>::value || is_std_array<U>::value) {
    std::size_t i = 0;
    for (auto&& x : t) for_each_with_path(x, join(std::to_string(i++)), f);
  } else if constexpr (is_map<U>::value) {
    for (auto&& [k, v] : t) for_each_with_path(v, join(key_str(k)), f);
  } else if constexpr (is_tuple<U>::value) {
    std::size_t i = 0;
    std::apply([&](auto&&... xs) { (for_each_with_path(xs, join(std::to_string(i++)), f), ...); }, t);
  } else if constexpr (is_pair<U>::value) {
    for_each_with_path(t.first, join("0"), f);
    for_each_with_path(t.second, join("1"), f);
  } else if constexpr (HasTreeFields<U>) {
    auto names = split_field_names(pmapcc_tree_field_names(static_cast<const U*>(nullptr)));
    std::size_t i = 0;
    std::apply([&](auto&&... xs) { (for_each_with_path(xs, join(names[i++]), f), ...); },
               pmapcc_tree_fields(t));
  } else {
    static_assert(always_false<U>, "not a pmapcc tree: use Array, a scalar, std::vector/array/tuple/pair/map of "
                                   "trees, or a struct declared with PMAPCC_TREE");
  }
}

template <class T, class F> T map_tree(const T& t, F& f) {
  if constexpr (Leaf<T>) {
    return f(t);
  } else if constexpr (is_vector<T>::value) {
    T out;
    out.reserve(t.size());
    for (const auto& x : t) out.push_back(map_tree(x, f));
    return out;
  } else if constexpr (is_std_array<T>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return T{map_tree(t[I], f)...}; }(
        std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (is_map<T>::value) {
    T out;
    for (const auto& [k, v] : t) out.emplace(k, map_tree(v, f));
    return out;
  } else if constexpr (is_tuple<T>::value) {
    return std::apply([&](const auto&... xs) { return T{map_tree(xs, f)...}; }, t);
  } else if constexpr (is_pair<T>::value) {
    auto first = map_tree(t.first, f);  // in tree order
    return T{std::move(first), map_tree(t.second, f)};
  } else if constexpr (HasTreeFields<T>) {
    T out{};
    auto dst = pmapcc_tree_fields(out);
    auto src = pmapcc_tree_fields(t);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((std::get<I>(dst) = map_tree(std::get<I>(src), f)), ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(src)>>{});
    return out;
  } else {
    static_assert(always_false<T>, "not a pmapcc tree");
  }
}

}  // namespace detail

// Calls f(leaf) for every leaf (Array& or scalar&, const when t is const), in tree order.
template <class T, class F> void tree_for_each(T&& t, F&& f) {
  auto g = [&](const std::string&, auto& leaf) { f(leaf); };
  detail::for_each_with_path(std::forward<T>(t), std::string(), g);
}

// Calls f(path, leaf) for every leaf; paths are "/"-joined: "params/0", "step".
template <class T, class F> void tree_for_each_with_path(T&& t, F&& f) {
  detail::for_each_with_path(std::forward<T>(t), std::string(), f);
}

// A new tree of the same structure whose leaves are f(leaf): f takes const Array& and returns Array,
// and takes each scalar type and returns that type (a generic lambda does both). Leaves are visited in
// tree order, so f may count them.
template <class T, class F> T tree_map(const T& t, F&& f) { return detail::map_tree(t, f); }

template <class T> std::size_t tree_num_leaves(const T& t) {
  std::size_t n = 0;
  tree_for_each(t, [&](const auto&) { ++n; });
  return n;
}

// A deep copy of a tree (Arrays copied onto their own devices).
template <class T> T tree_copy(const T& t) {
  return tree_map(t, [](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return leaf.copy();
    } else {
      return leaf;
    }
  });
}

}  // namespace pmap

// ---- PMAPCC_TREE(Type, field1, field2, ...): declares a struct's fields as tree children (up to 16).
// Use at namespace scope, in the struct's namespace, after the struct. The struct must be
// default-constructible and its fields move-assignable.
#define PMAPCC_TREE_EXPAND(x) x
#define PMAPCC_TREE_F1(p, a) p a
#define PMAPCC_TREE_F2(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F1(p, __VA_ARGS__))
#define PMAPCC_TREE_F3(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F2(p, __VA_ARGS__))
#define PMAPCC_TREE_F4(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F3(p, __VA_ARGS__))
#define PMAPCC_TREE_F5(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F4(p, __VA_ARGS__))
#define PMAPCC_TREE_F6(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F5(p, __VA_ARGS__))
#define PMAPCC_TREE_F7(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F6(p, __VA_ARGS__))
#define PMAPCC_TREE_F8(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F7(p, __VA_ARGS__))
#define PMAPCC_TREE_F9(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F8(p, __VA_ARGS__))
#define PMAPCC_TREE_F10(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F9(p, __VA_ARGS__))
#define PMAPCC_TREE_F11(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F10(p, __VA_ARGS__))
#define PMAPCC_TREE_F12(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F11(p, __VA_ARGS__))
#define PMAPCC_TREE_F13(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F12(p, __VA_ARGS__))
#define PMAPCC_TREE_F14(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F13(p, __VA_ARGS__))
#define PMAPCC_TREE_F15(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F14(p, __VA_ARGS__))
#define PMAPCC_TREE_F16(p, a, ...) p a, PMAPCC_TREE_EXPAND(PMAPCC_TREE_F15(p, __VA_ARGS__))
#define PMAPCC_TREE_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, ...) N
#define PMAPCC_TREE_EACH(p, ...)                                                                            \
  PMAPCC_TREE_EXPAND(PMAPCC_TREE_PICK(__VA_ARGS__, PMAPCC_TREE_F16, PMAPCC_TREE_F15, PMAPCC_TREE_F14,       \
                                      PMAPCC_TREE_F13, PMAPCC_TREE_F12, PMAPCC_TREE_F11, PMAPCC_TREE_F10,   \
                                      PMAPCC_TREE_F9, PMAPCC_TREE_F8, PMAPCC_TREE_F7, PMAPCC_TREE_F6,       \
                                      PMAPCC_TREE_F5, PMAPCC_TREE_F4, PMAPCC_TREE_F3, PMAPCC_TREE_F2,       \
                                      PMAPCC_TREE_F1)(p, __VA_ARGS__))

#define PMAPCC_TREE(Type, ...)                                                                          \
  [[maybe_unused]] inline auto pmapcc_tree_fields(Type& pmapcc_t) {                                      \
    return std::tie(PMAPCC_TREE_EACH(pmapcc_t., __VA_ARGS__));                                           \
  }                                                                                                      \
  [[maybe_unused]] inline auto pmapcc_tree_fields(const Type& pmapcc_t) {                                \
    return std::tie(PMAPCC_TREE_EACH(pmapcc_t., __VA_ARGS__));                                           \
  }                                                                                                      \
  [[maybe_unused]] inline constexpr std::string_view pmapcc_tree_field_names(const Type*) { return #__VA_ARGS__; }
