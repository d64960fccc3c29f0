// Moving trees between the host and the per-device view of a mesh: replicate / unreplicate (the same
// value on every device), shard / unshard (the leading axis split over the devices of some axes, or any
// dimensions split as PartitionSpecs say: partition.h).
// On a mesh spanning processes these work on this process's devices (Mesh::local_devices()).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <pmap/mesh.h>
#include <pmap/partition.h>
#include <pmap/sharded.h>
#include <pmap/tree.h>

namespace pmap {

namespace detail {
// Checks that every Array leaf can be split `parts` ways along its leading axis, and that all leaves
// agree on the leading size; throws ShapeError naming the caller (`who`), each leaf and its size. Returns the
// leading size.
std::int64_t check_shardable(const std::vector<std::pair<std::string, const Array*>>& leaves,
                             const std::vector<std::string>& scalar_paths, int parts, const std::string& axes,
                             const char* who = "shard");
// Piece index of each local device of the mesh when splitting over `axes` (row-major over the axes).
std::vector<int> piece_of_device(const Mesh& mesh, const AxisNames& axes);
// For each of `parts` pieces, the first local device holding it; ShapeError when another process
// holds a piece alone (unshard cannot read it: all_gather it inside pmap first).
std::vector<int> first_holders(const Mesh& mesh, const AxisNames& axes, int parts);

// A leaf split by a spec on a mesh: per dimension, its axes and its number of blocks; the block's shape.
struct Split {
  std::vector<AxisNames> axes;
  std::vector<int> parts;
  Shape block;
};
// Checks `spec` against a leaf of `shape` (`who`: "shard", "unshard" or "Feed"; `path` names the leaf): an
// axis the mesh does not have raises AxisError, an axis named twice ValueError, more entries than dimensions
// or a size the axes do not divide ShapeError, each naming the leaf, the dimension and the axis.
Split split_of(const char* who, const std::string& path, const Shape& shape, DType dtype, const P& spec,
               const Mesh& mesh);
// The whole leaf's shape from a block's (the same checks, but for sizes).
Shape whole_shape(const char* who, const std::string& path, const Shape& block, DType dtype, const P& spec,
                  const Mesh& mesh);
// Per local device of the mesh, its block's index along each dimension.
std::vector<std::vector<int>> block_index(const Mesh& mesh, const Split& split);
// Copies block `index` of a whole host array of `shape` (elements of `elem` bytes) into `block`, or (to_block
// false) back from it.
void copy_block(char* whole, char* block, const Shape& shape, const Split& split, const std::vector<int>& index,
                std::size_t elem, bool to_block);
// Whether every device's block is one contiguous run of the whole (only the leading dimension split).
bool contiguous_blocks(const Split& split);
// A copy of x's block `index` (x in host memory), on `device`.
Array take_block(const Array& x, const Split& split, const std::vector<int>& index, const Device& device);
// Assembles a whole leaf of `shape` in host memory from blocks[k] (the blocks in row-major block order).
Array join_blocks(const std::string& path, const Shape& shape, const Split& split,
                  const std::vector<const Array*>& blocks);
// Every block (row-major over the dimensions' blocks) and the first local device holding it; ShapeError
// naming the leaf when only other processes' devices hold one.
std::vector<int> block_holders(const Mesh& mesh, const Split& split, const std::string& path);
// The spec of each Array leaf (in `paths`' order) from `specs`; a path that names no leaf raises ValueError.
std::vector<P> specs_of_leaves(const std::vector<std::string>& paths, const std::map<std::string, P>& specs,
                               const char* who);
// `spec` for each of `paths`.
Specs one_spec(const std::vector<std::string>& paths, const P& spec);
// ShapeError unless a Sharded value of `entries` entries has one per local device of the mesh.
void check_entries(std::size_t entries, const Mesh& mesh);
// shard by specs, its errors starting with `who` ("shard", "shard_map: argument 1"); defined below.
template <class T> Sharded<T> shard_as(const char* who, const T& tree, const Mesh& mesh, const Specs& specs);
// The mesh's axes and every device, in order: "Mesh(data=2, model=2; cpu:0, cpu:1, cpu:2, cpu:3)" (Sharded::mesh).
std::string mesh_identity(const Mesh& mesh);
// The paths of the tree's Array leaves, in tree order.
template <class T> std::vector<std::string> array_paths(const T& tree) {
  std::vector<std::string> paths;
  tree_for_each_with_path(tree, [&](const std::string& path, const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) paths.push_back(path);
  });
  return paths;
}
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

// Splits every Array leaf as its spec says (JAX's device_put with a NamedSharding): the device whose index
// along a dimension's axes is i gets block i of that dimension; other leaves go to every device as they
// are. The result knows the specs (Sharded::specs), so unshard(result, mesh) assembles it. Every process
// passes the whole tree and keeps its devices' blocks.
template <class T> Sharded<T> shard(const T& tree, const Mesh& mesh, const Specs& specs) {
  return detail::shard_as("shard", tree, mesh, specs);
}
// One spec for every Array leaf.
template <class T> Sharded<T> shard(const T& tree, const Mesh& mesh, const P& spec) {
  return shard(tree, mesh, detail::one_spec(detail::array_paths(tree), spec));
}

namespace detail {
template <class T> Sharded<T> shard_as(const char* who, const T& tree, const Mesh& mesh, const Specs& specs) {
  const std::vector<std::string> paths = detail::array_paths(tree);
  const std::vector<P> spec = detail::specs_of_leaves(paths, specs.by_path(), who);
  std::vector<detail::Split> splits;
  std::vector<std::vector<std::vector<int>>> index;  // [leaf][device][dimension]
  std::vector<Array> host(paths.size());  // a leaf on a GPU: copied to the host once
  std::size_t k = 0;
  tree_for_each(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      splits.push_back(detail::split_of(who, paths[k], leaf.shape(), leaf.dtype(), spec[k], mesh));
      index.push_back(detail::block_index(mesh, splits.back()));
      if (!leaf.device().is_cpu()) host[k] = leaf.to(Device{});
      ++k;
    }
  });
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(mesh.local_size()));
  for (std::size_t d = 0; d < static_cast<std::size_t>(mesh.local_size()); ++d) {
    const Device& dev = mesh.local_devices()[d];
    std::size_t leaf_k = 0;
    out.push_back(tree_map(tree, [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
        const std::size_t i = leaf_k++;
        return detail::take_block(host[i].valid() ? host[i] : leaf, splits[i], index[i][d], dev);
      } else {
        return leaf;
      }
    }));
  }
  std::vector<LeafSpec> leaf_specs;
  for (std::size_t i = 0; i < paths.size(); ++i) leaf_specs.push_back({paths[i], spec[i]});
  return Sharded<T>(std::move(out), std::move(leaf_specs), detail::mesh_identity(mesh));
}
}  // namespace detail

// The inverse of shard by specs: each leaf assembled whole in host memory from its blocks, reading each block
// from the first local device holding it (ShapeError when only other processes' devices hold one).
template <class T> T unshard(const Sharded<T>& sharded, const Mesh& mesh, const Specs& specs) {
  detail::check_entries(sharded.size(), mesh);
  const std::vector<std::string> paths = detail::array_paths(sharded[0]);
  std::vector<std::vector<const Array*>> per_device(sharded.size());
  for (std::size_t d = 0; d < sharded.size(); ++d) {
    tree_for_each(sharded[d], [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) per_device[d].push_back(&leaf);
    });
    if (per_device[d].size() != paths.size())
      throw ShapeError("unshard: local device " + std::to_string(d) + "'s tree has " +
                       std::to_string(per_device[d].size()) + " arrays, the first device's " +
                       std::to_string(paths.size()));
  }
  const std::vector<P> spec = detail::specs_of_leaves(paths, specs.by_path(), "unshard");
  std::size_t k = 0;
  return tree_map(sharded[0], [&](const auto& first) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(first)>, Array>) {
      const std::size_t i = k++;
      const Shape whole = detail::whole_shape("unshard", paths[i], first.shape(), first.dtype(), spec[i], mesh);
      const detail::Split split = detail::split_of("unshard", paths[i], whole, first.dtype(), spec[i], mesh);
      std::vector<const Array*> blocks;
      for (int h : detail::block_holders(mesh, split, paths[i]))
        blocks.push_back(per_device[static_cast<std::size_t>(h)][i]);
      return detail::join_blocks(paths[i], whole, split, blocks);
    } else {
      return first;
    }
  });
}

// One spec for every Array leaf.
template <class T> T unshard(const Sharded<T>& sharded, const Mesh& mesh, const P& spec) {
  if (sharded.size() == 0) throw ShapeError("unshard: the Sharded value is empty");
  return unshard(sharded, mesh, detail::one_spec(detail::array_paths(sharded[0]), spec));
}

// The inverse of shard: the blocks concatenated along the leading axis, in host memory. For each block
// the first (local) device holding it is read; on a mesh spanning processes every block must have a
// local holder (ShapeError otherwise).
// A value shard made by specs (Sharded::specs not empty) is assembled by them when no axes are given. Other
// values (pmap's results, which carry no specs) are joined along the leading axis over `axes` (every axis
// when none are given): give their specs (the overloads above) where they were split otherwise.
template <class T> T unshard(const Sharded<T>& sharded, const Mesh& mesh, const AxisNames& axes = {}) {
  if (axes.empty() && !sharded.specs().empty()) {
    Specs specs;
    for (const LeafSpec& s : sharded.specs()) specs.set(s.path, s.spec);
    return unshard(sharded, mesh, specs);
  }
  detail::check_entries(sharded.size(), mesh);
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
