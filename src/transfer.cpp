// Host-side checks for shard / unshard (over this process's devices of the mesh).
#include <pmap/transfer.h>

#include "mesh_impl.h"

namespace pmap::detail {

std::int64_t check_shardable(const std::vector<std::pair<std::string, const Array*>>& leaves,
                             const std::vector<std::string>& scalar_paths, int parts, const std::string& axes) {
  auto label = [](const std::string& p) { return p.empty() ? std::string("the array") : "'" + p + "'"; };
  if (!scalar_paths.empty())
    throw ShapeError("shard: " + label(scalar_paths[0]) + " is a scalar and has no leading axis to split");
  if (leaves.empty()) throw ShapeError("shard: the tree has no arrays");
  for (const auto& [path, a] : leaves)
    if (a->ndim() == 0) throw ShapeError("shard: " + label(path) + " is a scalar array and has no leading axis");
  const std::int64_t rows = leaves[0].second->shape()[0];
  bool same = true;
  for (const auto& [path, a] : leaves) same = same && a->shape()[0] == rows;
  if (!same) {
    std::string msg = "shard: leaves have different leading sizes:";
    for (const auto& [path, a] : leaves) msg += " " + label(path) + " has " + std::to_string(a->shape()[0]) + ";";
    msg.pop_back();
    throw ShapeError(msg);
  }
  if (rows % parts != 0)
    throw ShapeError("shard over " + axes + " (" + std::to_string(parts) + " devices): leading size " +
                     std::to_string(rows) + " of " + label(leaves[0].first) + " is not divisible by " +
                     std::to_string(parts));
  return rows;
}

std::vector<int> piece_of_device(const Mesh& mesh, const AxisNames& axes) {
  std::vector<int> out;
  for (int d : mesh.impl().local_ids()) out.push_back(mesh.impl().axis_index(d, axes));
  return out;
}

std::vector<int> first_holders(const Mesh& mesh, const AxisNames& axes, int parts) {
  const auto piece = piece_of_device(mesh, axes);
  std::vector<int> holder(static_cast<std::size_t>(parts), -1);
  for (int d = static_cast<int>(piece.size()) - 1; d >= 0; --d)
    holder[static_cast<std::size_t>(piece[static_cast<std::size_t>(d)])] = d;
  for (int p = 0; p < parts; ++p)
    if (holder[static_cast<std::size_t>(p)] < 0)
      throw ShapeError("unshard over " + (axes.empty() ? std::string("all axes") : axes.str()) + ": block " +
                       std::to_string(p) + " lives only on other processes' devices; all_gather it inside pmap first");
  return holder;
}

}  // namespace pmap::detail
