// Moving trees between the host and the per-device view of a mesh: replicate / unreplicate (the same
// value on every device), shard / unshard (the leading axis split over the devices of some axes).
#pragma once

#include <string>
#include <vector>

#include <pmap/mesh.h>
#include <pmap/sharded.h>
#include <pmap/tree.h>

namespace pmap {

namespace detail {
// Checks that every Array leaf can be split `parts` ways along its leading axis, and that all leaves
// agree on the leading size; throws ShapeError naming each leaf and its size. Returns the leading size.
std::int64_t check_shardable(const std::vector<std::pair<std::string, const Array*>>& leaves,
                             const std::vector<std::string>& scalar_paths, int parts, const std::string& axes);
// Piece index of each mesh device when splitting over `axes` (row-major over the axes).
std::vector<int> piece_of_device(const Mesh& mesh, const AxisNames& axes);
}  // namespace detail

// A copy of `tree` on every device of the mesh (JAX's replicate / in_axes=None made explicit).
template <class T> Sharded<T> replicate(const T& tree, const Mesh& mesh) {
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(mesh.size()));
  for (const Device& d : mesh.devices())
    out.push_back(tree_map(tree, [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) return leaf.to(d);
      else return leaf;
    }));
  return Sharded<T>(std::move(out));
}

// Device 0's copy, brought to host memory. No gather: the other copies are not read.
template <class T> T unreplicate(const Sharded<T>& sharded) {
  if (sharded.size() == 0) throw ShapeError("unreplicate: the Sharded value is empty");
  return tree_map(sharded[0], [](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) return leaf.to(Device{});
    else return leaf;
  });
}

// Splits every Array leaf's leading axis into axis_size(axes) equal blocks; the device at index i
// along `axes` gets block i (devices that differ only along other axes get the same block).
// Scalar leaves, leaves without a leading axis, unequal leading sizes and indivisible sizes raise
// ShapeError naming the leaves and sizes.
template <class T> Sharded<T> shard(const T& tree, const Mesh& mesh, const AxisNames& axes = {}) {
  std::vector<std::pair<std::string, const Array*>> leaves;
  std::vector<std::string> scalars;
  tree_for_each_with_path(tree, [&](const std::string& path, const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) leaves.emplace_back(path, &leaf);
    else scalars.push_back(path);
  });
  const int parts = mesh.axis_size(axes);
  const std::string axes_label = axes.empty() ? std::string("all axes") : axes.str();
  const std::int64_t rows = detail::check_shardable(leaves, scalars, parts, axes_label);
  const std::int64_t block = rows / parts;
  const auto piece = detail::piece_of_device(mesh, axes);
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(mesh.size()));
  for (int d = 0; d < mesh.size(); ++d) {
    const std::int64_t begin = piece[static_cast<std::size_t>(d)] * block;
    const Device& dev = mesh.devices()[static_cast<std::size_t>(d)];
    out.push_back(tree_map(tree, [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
        return leaf.slice_rows(begin, begin + block, dev);
      } else {
        return leaf;
      }
    }));
  }
  return Sharded<T>(std::move(out));
}

// The inverse of shard: the blocks concatenated along the leading axis, in host memory. For each block
// the first device holding it is read.
template <class T> T unshard(const Sharded<T>& sharded, const Mesh& mesh, const AxisNames& axes = {}) {
  if (sharded.size() != static_cast<std::size_t>(mesh.size()))
    throw ShapeError("unshard: the Sharded value has " + std::to_string(sharded.size()) + " entries, the mesh " +
                     std::to_string(mesh.size()) + " devices");
  const auto piece = detail::piece_of_device(mesh, axes);
  const int parts = mesh.axis_size(axes);
  std::vector<int> holder(static_cast<std::size_t>(parts), -1);
  for (int d = mesh.size() - 1; d >= 0; --d) holder[static_cast<std::size_t>(piece[static_cast<std::size_t>(d)])] = d;
  std::vector<std::vector<const Array*>> per_device(sharded.size());
  for (std::size_t d = 0; d < sharded.size(); ++d)
    tree_for_each(sharded[d], [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) per_device[d].push_back(&leaf);
    });
  std::size_t leaf = 0;
  return tree_map(sharded[0], [&](const auto& first) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(first)>, Array>) {
      std::vector<const Array*> parts_of_leaf;
      for (int h : holder) parts_of_leaf.push_back(per_device[static_cast<std::size_t>(h)].at(leaf));
      ++leaf;
      return concatenate(parts_of_leaf, Device{});
    } else {
      return first;
    }
  });
}

}  // namespace pmap
