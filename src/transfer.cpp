// Host-side checks for shard / unshard (over this process's devices of the mesh).
#include <pmap/transfer.h>

#include <algorithm>
#include <cstring>

#include "mesh_impl.h"

namespace pmap::detail {

std::int64_t check_shardable(const std::vector<std::pair<std::string, const Array*>>& leaves,
                             const std::vector<std::string>& scalar_paths, int parts, const std::string& axes,
                             const char* who) {
  auto label = [](const std::string& p) { return p.empty() ? std::string("the array") : "'" + p + "'"; };
  const std::string fn = who;
  if (!scalar_paths.empty())
    throw ShapeError(fn + ": " + label(scalar_paths[0]) + " is a scalar and has no leading axis to split");
  if (leaves.empty()) throw ShapeError(fn + ": the tree has no arrays");
  for (const auto& [path, a] : leaves)
    if (a->ndim() == 0) throw ShapeError(fn + ": " + label(path) + " is a scalar array and has no leading axis");
  const std::int64_t rows = leaves[0].second->shape()[0];
  bool same = true;
  for (const auto& [path, a] : leaves) same = same && a->shape()[0] == rows;
  if (!same) {
    std::string msg = fn + ": leaves have different leading sizes:";
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

std::string mesh_identity(const Mesh& mesh) {
  std::string s = "Mesh(";
  for (std::size_t k = 0; k < mesh.axes().size(); ++k)
    s += (k ? ", " : "") + mesh.axes()[k].name + "=" + std::to_string(mesh.axes()[k].size);
  s += ";";
  for (std::size_t d = 0; d < mesh.devices().size(); ++d) s += (d ? ", " : " ") + mesh.devices()[d].str();
  return s + ")";
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

// ---- shard / unshard by PartitionSpecs (partition.h) ------------------------------------------------------

namespace pmap {

namespace detail {
namespace {

std::string leaf_label(const std::string& path) { return path.empty() ? std::string("the array") : "'" + path + "'"; }

// Row-major steps through every block index (parts per dimension); false once past the last.
bool next_index(std::vector<int>& index, const std::vector<int>& parts) {
  for (std::size_t d = index.size(); d-- > 0;) {
    if (++index[d] < parts[d]) return true;
    index[d] = 0;
  }
  return false;
}

}  // namespace

// Run by run along the last dimension.
void copy_block(char* whole, char* block, const Shape& shape, const Split& split, const std::vector<int>& index,
                std::size_t elem, bool to_block) {
  const std::size_t nd = shape.size();
  if (nd == 0) {
    if (to_block) std::memcpy(block, whole, elem);
    else std::memcpy(whole, block, elem);
    return;
  }
  for (std::int64_t d : split.block)
    if (d == 0) return;
  const std::size_t run = static_cast<std::size_t>(split.block[nd - 1]) * elem;
  std::vector<std::int64_t> at(nd - 1, 0);  // position inside the block, every dimension but the last
  for (std::size_t b = 0;; ++b) {
    std::int64_t offset = 0;  // in the whole array, in elements
    for (std::size_t d = 0; d < nd; ++d) {
      const std::int64_t i = (d + 1 < nd ? at[d] : 0) + std::int64_t{index[d]} * split.block[d];
      offset = offset * shape[d] + i;
    }
    char* w = whole + static_cast<std::size_t>(offset) * elem;
    char* k = block + b * run;
    if (to_block) std::memcpy(k, w, run);
    else std::memcpy(w, k, run);
    std::size_t d = nd - 1;
    for (; d-- > 0;) {
      if (++at[d] < split.block[d]) break;
      at[d] = 0;
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

bool contiguous_blocks(const Split& split) {
  for (std::size_t d = 1; d < split.parts.size(); ++d)
    if (split.parts[d] != 1) return false;
  return true;
}

namespace {

// The checks on a spec that do not need sizes: its rank, axes the mesh has, each axis once.
void check_spec(const std::string& leaf, std::size_t rank, const P& spec, const Mesh& mesh) {
  if (spec.size() > rank) {
    const AxisNames& extra = spec.dims()[rank];
    throw ShapeError(leaf + " has " + std::to_string(rank) + " dimension(s), but its spec " + spec.str() + " gives " +
                     std::to_string(spec.size()) + " (dimension " + std::to_string(rank) + ": " +
                     (extra.empty() ? std::string("None") : extra.str()) + ")");
  }
  std::vector<std::string> seen;
  for (std::size_t d = 0; d < spec.size(); ++d) {
    for (const std::string& name : spec.dims()[d].names()) {
      bool known = false;
      for (const AxisSpec& a : mesh.axes()) known = known || a.name == name;
      if (!known)
        throw AxisError(leaf + ": dimension " + std::to_string(d) + " of spec " + spec.str() + " names axis '" + name +
                        "', which " + mesh.str() + " does not have");
      if (std::find(seen.begin(), seen.end(), name) != seen.end())
        throw ValueError(leaf + ": spec " + spec.str() + " names axis '" + name + "' twice (again at dimension " +
                         std::to_string(d) + "); a mesh axis splits at most one dimension, once");
      seen.push_back(name);
    }
  }
}

std::string leaf_of(const char* who, const std::string& path, const Shape& shape, DType dtype) {
  return std::string(who) + ": " + leaf_label(path) + " " + std::string(name(dtype)) + shape_str(shape);
}

}  // namespace

Split split_of(const char* who, const std::string& path, const Shape& shape, DType dtype, const P& spec,
               const Mesh& mesh) {
  const std::string leaf = leaf_of(who, path, shape, dtype);
  check_spec(leaf, shape.size(), spec, mesh);
  Split s;
  s.block = shape;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const AxisNames axes = spec.axes_of(d);
    const int parts = axes.empty() ? 1 : mesh.axis_size(axes);
    if (shape[d] % parts != 0)
      throw ShapeError(leaf + ": dimension " + std::to_string(d) + " (size " + std::to_string(shape[d]) +
                       ") does not split evenly over " + axes.str() + " (" + std::to_string(parts) + " devices)");
    s.axes.push_back(axes);
    s.parts.push_back(parts);
    s.block[d] = shape[d] / parts;
  }
  return s;
}

Shape whole_shape(const char* who, const std::string& path, const Shape& block, DType dtype, const P& spec,
                  const Mesh& mesh) {
  check_spec(leaf_of(who, path, block, dtype) + " (a block)", block.size(), spec, mesh);
  Shape whole = block;
  for (std::size_t d = 0; d < spec.size(); ++d)
    if (!spec.dims()[d].empty()) whole[d] *= mesh.axis_size(spec.dims()[d]);
  return whole;
}

std::vector<std::vector<int>> block_index(const Mesh& mesh, const Split& split) {
  std::vector<std::vector<int>> out;
  for (int id : mesh.impl().local_ids()) {
    std::vector<int> index;
    for (const AxisNames& axes : split.axes) index.push_back(axes.empty() ? 0 : mesh.impl().axis_index(id, axes));
    out.push_back(std::move(index));
  }
  return out;
}

Array take_block(const Array& x, const Split& split, const std::vector<int>& index, const Device& device) {
  if (!x.device().is_cpu()) throw Error("take_block: the whole leaf must be in host memory");
  const Array& src = x;
  Array block = Array::uninitialized(split.block, x.dtype(), Device{});  // the runs cover it
  copy_block(static_cast<char*>(const_cast<void*>(src.raw_data())), static_cast<char*>(block.raw_data()), x.shape(),
             split, index, size_of(x.dtype()), true);
  return device == Device{} ? std::move(block) : block.to(device);
}

Array join_blocks(const std::string& path, const Shape& shape, const Split& split,
                  const std::vector<const Array*>& blocks) {
  Array whole = Array::uninitialized(shape, blocks.at(0)->dtype(), Device{});  // the blocks cover it
  std::vector<int> index(shape.size(), 0);
  std::size_t k = 0;
  do {
    const Array& b = *blocks.at(k++);
    if (b.shape() != split.block || b.dtype() != whole.dtype())
      throw ShapeError("unshard: " + leaf_label(path) + ": a device's block is " + b.signature() + ", not " +
                       std::string(name(whole.dtype())) + shape_str(split.block) + " as the first device's");
    const Array host = b.device().is_cpu() ? Array() : b.to(Device{});
    const Array& src = b.device().is_cpu() ? b : host;
    copy_block(static_cast<char*>(whole.raw_data()), static_cast<char*>(const_cast<void*>(src.raw_data())), shape,
               split, index, size_of(whole.dtype()), false);
  } while (next_index(index, split.parts));
  return whole;
}

std::vector<int> block_holders(const Mesh& mesh, const Split& split, const std::string& path) {
  const std::vector<std::vector<int>> index = block_index(mesh, split);
  std::vector<int> holders;
  std::vector<int> want(split.parts.size(), 0);
  do {
    int h = -1;
    for (std::size_t d = 0; d < index.size() && h < 0; ++d)
      if (index[d] == want) h = static_cast<int>(d);
    if (h < 0) {
      std::string at;
      for (int i : want) at += (at.empty() ? "" : ", ") + std::to_string(i);
      throw ShapeError("unshard: block (" + at + ") of " + leaf_label(path) +
                       " lives only on other processes' devices; all_gather it inside pmap first");
    }
    holders.push_back(h);
  } while (next_index(want, split.parts));
  return holders;
}

std::vector<P> specs_of_leaves(const std::vector<std::string>& paths, const std::map<std::string, P>& specs,
                               const char* who) {
  for (const auto& [path, spec] : specs) {
    if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
      std::string known;
      for (const std::string& p : paths) known += (known.empty() ? "" : ", ") + leaf_label(p);
      throw ValueError(std::string(who) + ": the specs name " + leaf_label(path) + " (" + spec.str() +
                       "), which is not an array leaf of the tree (its array leaves: " + known + ")");
    }
  }
  std::vector<P> out;
  for (const std::string& p : paths) {
    auto it = specs.find(p);
    out.push_back(it == specs.end() ? P() : it->second);
  }
  return out;
}

Specs one_spec(const std::vector<std::string>& paths, const P& spec) {
  Specs specs;
  for (const std::string& p : paths) specs.set(p, spec);
  return specs;
}

void check_entries(std::size_t entries, const Mesh& mesh) {
  if (entries != static_cast<std::size_t>(mesh.local_size()))
    throw ShapeError("unshard: the Sharded value has " + std::to_string(entries) + " entries, the mesh " +
                     std::to_string(mesh.local_size()) + (mesh.local_size() == mesh.size() ? "" : " local") +
                     " devices");
}

}  // namespace detail
}  // namespace pmap
