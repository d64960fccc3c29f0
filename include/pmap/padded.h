// Sizes that do not divide: shard_padded splits a leading axis of any size over the devices, padding the last
// blocks with zeros, and tells each device which of its rows are real; unshard_padded assembles per-row
// results without the padding, so no example is dropped. With pmean weighted by the real counts
// (collectives.h), a mean over each device's real rows is the mean over every row.
//
//   auto batch = pmap::shard_padded(Batch{x, y}, mesh, "data");  // 127 rows on 3 devices: 43, 43, 41 (+2 zero)
//   auto grads = pmap::pmap([&](const pmap::Padded<Batch>& b) {
//     const double total = pmap::psum(double(b.count), "data");   // 127 on every device
//     // the loss: the sum over the real rows (b.mask: 1, padding: 0) divided by total; then
//     return pmap::psum(pmap::grad(loss)(params, b), "data");   // the gradient of the 127 rows' mean
//   }, mesh)(batch);
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <pmap/transfer.h>

namespace pmap {

// One device's block of a tree split by shard_padded.
template <class T> struct Padded {
  T value;               // the block: ceil(rows / parts) rows of every leaf; the rows from `count` on are zeros
  Array mask;            // (block rows) f32 on the device: 1 for a real row, 0 for padding
  std::int64_t count{};  // the block's real rows (0 for a device past the end)
  std::int64_t piece{};  // which piece: rows [piece * block rows, ...) of the whole
};
template <class T> auto pmapcc_tree_fields(Padded<T>& p) { return std::tie(p.value, p.mask, p.count, p.piece); }
template <class T> auto pmapcc_tree_fields(const Padded<T>& p) { return std::tie(p.value, p.mask, p.count, p.piece); }
template <class T> constexpr std::string_view pmapcc_tree_field_names(const Padded<T>*) {
  return "value, mask, count, piece";
}

namespace detail {
// Per local device, the rows [begin, begin + count) of the whole it holds when `rows` are split over `axes` in
// blocks of `block` rows; ShapeError for a tree without arrays, scalar leaves, or unequal leading sizes.
struct PaddedSplit {
  std::int64_t rows = 0, block = 0;
  std::vector<int> piece;
  std::vector<std::int64_t> begin, count;
};
PaddedSplit padded_split(const std::vector<std::pair<std::string, const Array*>>& leaves,
                         const std::vector<std::string>& scalar_paths, const Mesh& mesh, const AxisNames& axes);
// Rows [begin, begin + count) of a host array, then zeros up to `block` rows, on `device`.
Array padded_rows(const Array& host, std::int64_t begin, std::int64_t count, std::int64_t block, const Device& device);
// (block) f32 on `device`: `count` ones, then zeros.
Array row_mask(std::int64_t count, std::int64_t block, const Device& device);
}  // namespace detail

// Splits every Array leaf's leading axis (all of one size, any size) over the devices of `axes` (every
// axis when none are given) as pieces of ceil(rows / parts) rows: piece i is rows [i * block, (i + 1) *
// block), cut at the end and padded with zeros, so only the last pieces are padded (127 rows on 3 devices:
// 43, 43, 41). Devices that differ only along other axes get the same piece. Every process passes the whole
// tree and keeps its devices' pieces. Leaves that are not Arrays raise ShapeError, as in shard.
template <class T> Sharded<Padded<T>> shard_padded(const T& tree, const Mesh& mesh, const AxisNames& axes = {}) {
  std::vector<std::pair<std::string, const Array*>> leaves;
  std::vector<std::string> scalars;
  tree_for_each_with_path(tree, [&](const std::string& path, const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) leaves.emplace_back(path, &leaf);
    else scalars.push_back(path);
  });
  const detail::PaddedSplit split = detail::padded_split(leaves, scalars, mesh, axes);
  std::vector<Array> host;  // a leaf on a GPU: copied to the host once
  for (const auto& leaf : leaves) host.push_back(leaf.second->device().is_cpu() ? Array() : leaf.second->to(Device{}));
  std::vector<Padded<T>> out;
  for (std::size_t d = 0; d < static_cast<std::size_t>(mesh.local_size()); ++d) {
    const Device& dev = mesh.local_devices()[d];
    std::size_t k = 0;
    T value = tree_map(tree, [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
        const std::size_t i = k++;
        return detail::padded_rows(host[i].valid() ? host[i] : leaf, split.begin[d], split.count[d], split.block, dev);
      } else {
        return leaf;
      }
    });
    out.push_back(Padded<T>{std::move(value), detail::row_mask(split.count[d], split.block, dev), split.count[d],
                            split.piece[d]});
  }
  return Sharded<Padded<T>>(std::move(out));
}

namespace detail {
// ShapeError unless the results and `like` (its entries' pieces) have one entry per local device; ValueError
// when `like` was split over other axes (its pieces are not those of `axes`).
void check_padded_result(std::size_t entries, const std::vector<std::int64_t>& like_pieces, const Mesh& mesh,
                         const AxisNames& axes);
// ShapeError unless every device's result has as many arrays (`counts`) as the first (`paths`).
void check_padded_leaves(const std::vector<std::string>& paths, const std::vector<std::size_t>& counts);
}  // namespace detail

// Assembles per-row results of a pmap over shard_padded's pieces (`like`: the padded argument, which says
// each piece's real rows): each Array leaf's first `count` rows of each piece, concatenated in piece order in
// host memory, so the result has every real row and no padding. Each piece is read from the first local
// device holding it (ShapeError when only other processes' devices hold one, or a leaf has fewer rows;
// ValueError when `axes` are not those shard_padded split `like` over).
template <class T, class U>
T unshard_padded(const Sharded<T>& blocks, const Mesh& mesh, const Sharded<Padded<U>>& like,
                 const AxisNames& axes = {}) {
  std::vector<std::int64_t> pieces;
  for (const Padded<U>& p : like) pieces.push_back(p.piece);
  detail::check_padded_result(blocks.size(), pieces, mesh, axes);
  const int parts = mesh.axis_size(axes);
  const std::vector<int> holder = detail::first_holders(mesh, axes, parts);
  const std::vector<std::string> paths = detail::array_paths(blocks[0]);
  std::vector<std::vector<const Array*>> per_device(blocks.size());
  std::vector<std::size_t> counts;
  for (std::size_t d = 0; d < blocks.size(); ++d) {
    tree_for_each(blocks[d], [&](const auto& leaf) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) per_device[d].push_back(&leaf);
    });
    counts.push_back(per_device[d].size());
  }
  detail::check_padded_leaves(paths, counts);
  std::size_t leaf = 0;
  return tree_map(blocks[0], [&](const auto& first) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(first)>, Array>) {
      std::vector<Array> rows;
      for (int h : holder) {
        const auto hd = static_cast<std::size_t>(h);
        const Array& a = *per_device[hd][leaf];
        const std::int64_t count = like[hd].count;
        if (a.ndim() == 0 || a.shape()[0] < count)
          throw ShapeError("unshard_padded: " +
                           (paths[leaf].empty() ? std::string("the result") : "'" + paths[leaf] + "'") + " of " +
                           mesh.local_devices()[hd].str() + " is " + a.signature() +
                           ", fewer rows than its piece's " + std::to_string(count) + " real ones");
        rows.push_back(a.slice_rows(0, count, Device{}));
      }
      ++leaf;
      std::vector<const Array*> parts_of_leaf;
      for (const Array& r : rows) parts_of_leaf.push_back(&r);
      return concatenate(parts_of_leaf, Device{});
    } else {
      return first;
    }
  });
}

}  // namespace pmap
