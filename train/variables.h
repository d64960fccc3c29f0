// Variables: a member's tensors of one role (its parameters, its model state, its optimizer state) by name,
// "Conv_0/kernel", as a std::map: grad, vmap, jit, pmap, shard and the optimizers take it as they take a
// PMAPCC_TREE struct, and the names are the ones the program's checkpoints and layouts use. A model is written
// with typed structs (nn/'s modules: ConvParams, DenseParams, ...); to_variables and from_variables go between
// the two without copying a tensor.
#pragma once

#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <pmap/array.h>
#include <pmap/error.h>
#include <pmap/tree.h>

#include <pmapcc/core/vmap.h>

namespace pmap::train {

using Variables = std::map<std::string, Array>;

// Every Array leaf of `tree` by its path (tree_for_each_with_path's), moved out of the tree (traced values
// stay traced). Scalar leaves are not variables: ValueError naming the leaf.
template <class T> Variables to_variables(T tree) {
  Variables out;
  tree_for_each_with_path(tree, [&](const std::string& path, auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      out.emplace(path, std::move(leaf));
    } else {
      throw ValueError("to_variables: leaf '" + path + "' is a scalar; variables are Arrays");
    }
  });
  return out;
}

// The names to_variables gives T's leaves, in T's order (a default-constructed T: structs of fixed fields).
template <class T> std::vector<std::string> variable_names() {
  std::vector<std::string> names;
  tree_for_each_with_path(T{}, [&](const std::string& path, const auto&) { names.push_back(path); });
  return names;
}

// A T whose every Array leaf is v's tensor of the leaf's path, as a view (no copy: v must outlive it). `what`
// names v in errors:
// ValueError naming the missing tensor, or the tensors T has no leaf for.
template <class T> T from_variables(const Variables& v, const char* what = "variables") {
  T out{};
  std::size_t used = 0;
  tree_for_each_with_path(out, [&](const std::string& path, auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      auto it = v.find(path);
      if (it == v.end()) throw ValueError(std::string(what) + ": no tensor '" + path + "'");
      leaf = vmap_detail::alias(it->second);
      ++used;
    }
  });
  if (used != v.size()) {
    std::string extra;
    const auto names = variable_names<T>();
    for (const auto& [name, a] : v) {
      bool known = false;
      for (const std::string& n : names) known = known || n == name;
      if (!known) extra += (extra.empty() ? "'" : ", '") + name + "'";
    }
    throw ValueError(std::string(what) + ": unexpected tensors " + extra);
  }
  return out;
}

}  // namespace pmap::train
