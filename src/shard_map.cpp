// shard_map's host-side checks (shard_map.h): the specs against the arguments, and the devices' outputs
// against the out specs' promises.
#include <pmap/shard_map.h>

#include <cstdio>
#include <cstring>

#include "mesh_impl.h"

namespace pmap {

std::vector<P> TreeSpec::of_leaves(const std::vector<std::string>& paths, const std::string& who) const {
  if (const P* one = std::get_if<P>(&spec_)) return std::vector<P>(paths.size(), *one);
  return detail::specs_of_leaves(paths, std::get<Specs>(spec_).by_path(), who.c_str());
}

Specs TreeSpec::by_path(const std::vector<std::string>& paths) const {
  if (const P* one = std::get_if<P>(&spec_)) return detail::one_spec(paths, *one);
  return std::get<Specs>(spec_);
}

namespace detail {

namespace {

std::string leaf_name(const std::string& path) { return path.empty() ? std::string("the array") : "'" + path + "'"; }

// P('data') and P('data', None) split alike: the entries past the last split dimension do not count.
bool same_split(const P& a, const P& b) {
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t d = 0; d < n; ++d)
    if (a.axes_of(d) != b.axes_of(d)) return false;
  return true;
}

// "cpu:1 (data 0, model 1)": a local device and its index along each axis of the mesh.
std::string device_label(const Mesh& mesh, std::size_t local) {
  const int id = mesh.impl().local_ids()[local];
  std::string s = mesh.local_devices()[local].str() + " (";
  for (std::size_t k = 0; k < mesh.axes().size(); ++k) {
    const std::string& axis = mesh.axes()[k].name;
    s += (k ? ", " : "") + axis + " " + std::to_string(mesh.impl().axis_index(id, AxisNames(axis)));
  }
  return s + ")";
}

// The mesh axes along which two local devices' positions differ, as "'model'" or "'data', 'model'".
std::string axes_between(const Mesh& mesh, std::size_t a, std::size_t b) {
  const int ia = mesh.impl().local_ids()[a], ib = mesh.impl().local_ids()[b];
  std::string s;
  for (const AxisSpec& axis : mesh.axes())
    if (mesh.impl().axis_index(ia, AxisNames(axis.name)) != mesh.impl().axis_index(ib, AxisNames(axis.name)))
      s += (s.empty() ? "'" : ", '") + axis.name + "'";
  return s;
}

std::string element_str(const Array& host, std::int64_t k) {
  char buf[64];
  switch (host.dtype()) {
    case DType::f32: std::snprintf(buf, sizeof buf, "%.9g", double(host.data<float>()[k])); return buf;
    case DType::f64: std::snprintf(buf, sizeof buf, "%.17g", host.data<double>()[k]); return buf;
    case DType::i32: return std::to_string(host.data<std::int32_t>()[k]);
    case DType::i64: return std::to_string(host.data<std::int64_t>()[k]);
    case DType::u32: return std::to_string(host.data<std::uint32_t>()[k]);
    case DType::u8: return std::to_string(host.data<std::uint8_t>()[k]);
  }
  return "?";
}

}  // namespace

void check_in_spec_count(std::size_t specs, std::size_t arguments) {
  if (specs != arguments)
    throw ValueError("shard_map: in_specs has " + std::to_string(specs) + " entries, but f is called with " +
                     std::to_string(arguments) + " argument(s); give one (a P, or Specs by leaf path) per argument");
}

void check_sharded_argument(std::size_t index, std::size_t entries, const std::vector<LeafSpec>& have,
                            const std::vector<std::string>& paths, const std::vector<P>& want, const Mesh& mesh) {
  const std::string who = "shard_map: argument " + std::to_string(index);
  if (entries != static_cast<std::size_t>(mesh.local_size()))
    throw ShapeError(who + " is a Sharded value of " + std::to_string(entries) + " entries, but the mesh has " +
                     std::to_string(mesh.local_size()) + " local devices");
  if (paths.empty()) return;
  if (have.empty())
    throw ValueError(who + " is a Sharded value that carries no specs (pmap's results and replicate's carry none): "
                           "pass the whole tree, or a value made by shard(tree, mesh, specs) or by shard_map's "
                           "sharded()");
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (i >= have.size() || have[i].path != paths[i])
      throw ValueError(who + ": its specs do not match its tree (" + leaf_name(paths[i]) +
                       " has none); it was not made from this tree");
    if (!same_split(have[i].spec, want[i]))
      throw ValueError(who + ": " + leaf_name(paths[i]) + " is split by " + have[i].spec.str() + ", but in_specs give " +
                       want[i].str() + "; reshard it (unshard, then shard) or change the in spec");
  }
}

void check_outputs(const Mesh& mesh, const std::vector<std::string>& paths, const std::vector<P>& specs,
                   const std::vector<OutputLeaves>& devices, bool compare) {
  const OutputLeaves& first = devices.at(0);
  for (std::size_t d = 1; d < devices.size(); ++d) {
    if (devices[d].arrays.size() != first.arrays.size() || devices[d].scalars.size() != first.scalars.size())
      throw ShapeError("shard_map: " + device_label(mesh, d) + " returned a tree of " +
                       std::to_string(devices[d].arrays.size()) + " arrays and " +
                       std::to_string(devices[d].scalars.size()) + " scalars, " + device_label(mesh, 0) + " one of " +
                       std::to_string(first.arrays.size()) + " and " + std::to_string(first.scalars.size()));
    if (!compare) continue;
    for (std::size_t k = 0; k < first.scalars.size(); ++k)
      if (devices[d].scalars[k].second != first.scalars[k].second)
        throw ValueError("shard_map: output " + leaf_name(first.scalars[k].first) +
                         " (a scalar leaf: it has no spec, so it must be the same on every device) differs between " +
                         device_label(mesh, 0) + " and " + device_label(mesh, d));
  }
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const Array& a0 = *first.arrays[i];
    const Shape whole = whole_shape("shard_map: output", paths[i], a0.shape(), a0.dtype(), specs[i], mesh);
    const Split split = split_of("shard_map: output", paths[i], whole, a0.dtype(), specs[i], mesh);
    for (std::size_t d = 1; d < devices.size(); ++d) {
      const Array& a = *devices[d].arrays[i];
      if (a.shape() != a0.shape() || a.dtype() != a0.dtype())
        throw ShapeError("shard_map: output " + leaf_name(paths[i]) + ": " + device_label(mesh, d) + "'s block is " +
                         a.signature() + ", " + device_label(mesh, 0) + "'s " + a0.signature() +
                         "; every device's block of an output has one shape and dtype");
    }
    if (!compare) continue;
    const std::vector<std::vector<int>> index = block_index(mesh, split);
    std::vector<Array> copies(devices.size());
    auto host = [&](std::size_t d) -> const Array& {
      const Array& a = *devices[d].arrays[i];
      if (a.device().is_cpu()) return a;
      if (!copies[d].valid()) copies[d] = a.to(Device{});
      return copies[d];
    };
    for (std::size_t d = 1; d < devices.size(); ++d) {
      std::size_t e = 0;
      while (e < d && index[e] != index[d]) ++e;
      if (e == d) continue;  // the first holder of its block
      const Array& x = host(e);
      const Array& y = host(d);
      if (x.nbytes() == 0 || std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0) continue;
      const std::size_t elem = size_of(x.dtype());
      std::int64_t k = 0;
      while (std::memcmp(static_cast<const char*>(x.raw_data()) + k * elem,
                         static_cast<const char*>(y.raw_data()) + k * elem, elem) == 0)
        ++k;
      const std::string axes = axes_between(mesh, e, d);
      throw ValueError("shard_map: output " + leaf_name(paths[i]) + " " + x.signature() + " (out spec " +
                       specs[i].str() + ") differs between " + device_label(mesh, e) + " and " +
                       device_label(mesh, d) + ", which hold the same block: the spec does not name " + axes +
                       ", a promise that the output is equal along it (first difference at element " +
                       std::to_string(k) + " of the block: " + element_str(x, k) + " against " +
                       element_str(y, k) + "). Reduce it over " + axes + " inside f (psum, pmean), or name " + axes +
                       " in its out spec");
    }
  }
}

}  // namespace detail

}  // namespace pmap
