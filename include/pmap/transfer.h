// Moving trees between the host and the per-device view of a mesh: replicate / unreplicate (the same
// value on every device), shard / unshard (the leading axis split over the devices of some axes).
// On a mesh spanning processes these work on this process's devices (Mesh::local_devices()).
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
// Piece index of each local device of the mesh when splitting over `axes` (row-major over the axes).
std::vector<int> piece_of_device(const Mesh& mesh, const AxisNames& axes);
// For each of `parts` pieces, the first local device holding it; ShapeError when another process
// holds a piece alone (unshard cannot read it: all_gather it inside pmap first).
std::vector<int> first_holders(const Mesh& mesh, const AxisNames& axes, int parts);
}  // namespace detail

// A copy of `tree` on every (local) device of the mesh (JAX's replicate / in_axes=None made explicit).
template <class T> Sharded<T> replicate(const T& tree, const Mesh& mesh) {
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(mesh.local_size()));
  for (const Device& d : mesh.local_devices())
    out.push_back(tree_map(tree, [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) return leaf.to(d);
      else return leaf;
    }));
  return Sharded<T>(std::move(out));
}

// The first (local) device's copy, brought to host memory. No gather: the other copies are not read.
template <class T> T unreplicate(const Sharded<T>& sharded) {
  if (sharded.size() == 0) throw ShapeError("unreplicate: the Sharded value is empty");
  return tree_map(sharded[0], [](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) return leaf.to(Device{});
    else return leaf;
  });
}

// Splits every Array leaf's leading axis into axis_size(axes) equal blocks; the device at index i
// along `axes` gets block i (devices that differ only along other axes get the same block). Every
// process passes the whole tree and keeps its devices' blocks.
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
  out.reserve(static_cast<std::size_t>(mesh.local_size()));
  for (int d = 0; d < mesh.local_size(); ++d) {
    const std::int64_t begin = piece[static_cast<std::size_t>(d)] * block;
    const Device& dev = mesh.local_devices()[static_cast<std::size_t>(d)];
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
// the first (local) device holding it is read; on a mesh spanning processes every block must have a
// local holder (ShapeError otherwise).
template <class T> T unshard(const Sharded<T>& sharded, const Mesh& mesh, const AxisNames& axes = {}) {
  if (sharded.size() != static_cast<std::size_t>(mesh.local_size()))
    throw ShapeError("unshard: the Sharded value has " + std::to_string(sharded.size()) + " entries, the mesh " +
                     std::to_string(mesh.local_size()) + (mesh.local_size() == mesh.size() ? "" : " local") +
                     " devices");
  const std::vector<int> holder = detail::first_holders(mesh, axes, mesh.axis_size(axes));
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
