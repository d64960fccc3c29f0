// shard_map's host-side checks (shard_map.h): the specs against the arguments, and the devices' outputs
// against the out specs' promises.
#include <pmap/shard_map.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>

#include <pmap/detail/hash.h>

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

void refuse_traced(std::size_t index, const std::string& path, bool batched) {
  const std::string which = "shard_map: argument " + std::to_string(index) +
                            (path.empty() ? "" : ", leaf '" + path + "',");
  if (batched)
    throw NotAvailable(which + " is a value that vmap traces: vmap of a function that calls shard_map is not "
                       "supported (f's blocks would be copies vmap does not follow); vmap inside f, or stack the "
                       "members along an axis the specs split");
  throw NotAvailable(which + " is a value that grad traces, given to sharded() or beside a Sharded argument: its "
                     "blocks would be copies the gradient does not follow; call shard_map(...)(args) with whole "
                     "trees, whose result is whole and differentiable");
}

namespace {
std::atomic<TracedShardMapHandler> traced_shard_map{nullptr};
}  // namespace

Array leaf_view(const Array& x) {
  Array v = Array::borrow(const_cast<void*>(x.raw_data()), x.shape(), x.dtype(), x.device());
  set_trace_tag(v, trace_tag(x));
  return v;
}

void set_traced_shard_map_handler(TracedShardMapHandler handler) noexcept { traced_shard_map.store(handler); }
TracedShardMapHandler traced_shard_map_handler() noexcept { return traced_shard_map.load(); }

void check_in_spec_count(std::size_t specs, std::size_t arguments) {
  if (specs != arguments)
    throw ValueError("shard_map: in_specs has " + std::to_string(specs) + " entries, but f is called with " +
                     std::to_string(arguments) + " argument(s); give one (a P, or Specs by leaf path) per argument");
}

void check_sharded_entries(std::size_t index, std::size_t entries, const std::string& made_on,
                           const std::vector<std::vector<Device>>& devices, const Mesh& mesh) {
  const std::string who = "shard_map: argument " + std::to_string(index);
  if (entries != static_cast<std::size_t>(mesh.local_size()))
    throw ShapeError(who + " is a Sharded value of " + std::to_string(entries) + " entries, but the mesh has " +
                     std::to_string(mesh.local_size()) + " local devices");
  const std::string here = mesh_identity(mesh);
  if (!made_on.empty() && made_on != here)
    throw ValueError(who + " was split on " + made_on + ", not on this " + here +
                     "; unshard it there and pass the whole tree");
  for (std::size_t d = 0; d < entries; ++d)
    for (const Device& at : devices[d])
      if (at != mesh.local_devices()[d])
        throw ValueError(who + ": entry " + std::to_string(d) + " holds an array on " + at.str() + ", but the mesh's " +
                         "local device " + std::to_string(d) + " is " + mesh.local_devices()[d].str());
}

void check_sharded_specs(std::size_t index, const std::vector<LeafSpec>& have, const std::vector<std::string>& paths,
                         const std::vector<P>& want) {
  const std::string who = "shard_map: argument " + std::to_string(index);
  if (paths.empty()) return;
  if (have.empty())
    throw ValueError(who + " is a Sharded value that carries no specs (pmap's results and replicate's carry none): "
                           "pass the whole tree, or a value made by shard(tree, mesh, specs) or by shard_map's "
                           "sharded()");
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (have.size() != paths.size() || have[i].path != paths[i])
      throw ValueError(who + ": its specs name other leaves than its tree has (" + leaf_name(paths[i]) +
                       "); it was not made from this tree");
    if (!same_split(have[i].spec, want[i]))
      throw ValueError(who + ": " + leaf_name(paths[i]) + " is split by " + have[i].spec.str() +
                       ", but in_specs give " + want[i].str() +
                       "; reshard it (unshard, then shard) or change the in spec");
  }
}

namespace {

// "output" for a lone array, "output 'y'" for a leaf of a tree.
std::string output_label(const std::string& path) {
  return path.empty() ? std::string("output") : "output '" + path + "'";
}

// Every local device returned a tree of the same leaves (paths, then each block's shape and dtype).
void check_structure(const Mesh& mesh, const std::vector<std::string>& paths,
                     const std::vector<OutputLeaves>& devices) {
  const OutputLeaves& first = devices.at(0);
  for (std::size_t d = 1; d < devices.size(); ++d) {
    const OutputLeaves& o = devices[d];
    bool same = o.paths == first.paths && o.scalars.size() == first.scalars.size();
    for (std::size_t k = 0; same && k < o.scalars.size(); ++k) same = o.scalars[k].first == first.scalars[k].first;
    if (!same)
      throw ShapeError("shard_map: " + device_label(mesh, d) + " returned a tree of " + std::to_string(o.paths.size()) +
                       " arrays and " + std::to_string(o.scalars.size()) + " scalars, not the leaves of " +
                       device_label(mesh, 0) + "'s (" + std::to_string(first.paths.size()) + " arrays and " +
                       std::to_string(first.scalars.size()) + " scalars)");
  }
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const Array& a0 = *first.arrays[i];
    for (std::size_t d = 1; d < devices.size(); ++d) {
      const Array& a = *devices[d].arrays[i];
      if (a.shape() != a0.shape() || a.dtype() != a0.dtype())
        throw ShapeError("shard_map: " + output_label(paths[i]) + ": " + device_label(mesh, d) + "'s block is " +
                         a.signature() + ", " + device_label(mesh, 0) + "'s " + a0.signature() +
                         "; every device's block of an output has one shape and dtype");
    }
  }
}

// The out specs checked against the first device's blocks; each leaf's split.
std::vector<Split> splits_of(const Mesh& mesh, const std::vector<std::string>& paths, const std::vector<P>& specs,
                             const OutputLeaves& first) {
  std::vector<Split> splits;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const Array& a0 = *first.arrays[i];
    const Shape whole = whole_shape("shard_map: output", paths[i], a0.shape(), a0.dtype(), specs[i], mesh);
    splits.push_back(split_of("shard_map: output", paths[i], whole, a0.dtype(), specs[i], mesh));
  }
  return splits;
}

[[noreturn]] void raise_unequal(const std::string& path, const std::string& signature, const P& spec,
                                const std::string& a, const std::string& b, const std::string& axes,
                                const std::string& where) {
  const bool several = axes.find(", ") != std::string::npos;
  throw ValueError("shard_map: " + output_label(path) + " " + signature + " (out spec " + spec.str() +
                   ") differs between " + a + " and " + b + ", which hold the same block: the spec does not name " +
                   axes + ", a promise that the output is equal along " + (several ? "them" : "it") + where +
                   ". Reduce it over " + axes + " inside f (psum, pmean), or name " + axes + " in its out spec");
}

[[noreturn]] void raise_scalar(const std::string& path, const std::string& a, const std::string& b) {
  throw ValueError("shard_map: " + output_label(path) +
                   " (a scalar leaf: it has no spec, so it must be the same on every device) differs between " + a +
                   " and " + b);
}

// This process's devices: the blocks two devices of one block index hold, bit for bit.
void compare_local(const Mesh& mesh, const std::string& path, const P& spec, const Split& split,
                   const std::vector<const Array*>& blocks) {
  const std::vector<std::vector<int>> index = block_index(mesh, split);
  std::vector<Array> copies(blocks.size());
  auto host = [&](std::size_t d) -> const Array& {
    if (blocks[d]->device().is_cpu()) return *blocks[d];
    if (!copies[d].valid()) copies[d] = blocks[d]->to(Device{});
    return copies[d];
  };
  for (std::size_t d = 1; d < blocks.size(); ++d) {
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
    raise_unequal(path, x.signature(), spec, device_label(mesh, e), device_label(mesh, d), axes_between(mesh, e, d),
                  " (first difference at element " + std::to_string(k) + " of the block: " + element_str(x, k) +
                      " against " + element_str(y, k) + ")");
  }
}

std::int64_t hash_of(const Array& a) {
  const Array host = a.device().is_cpu() ? Array() : a.to(Device{});
  const Array& h = a.device().is_cpu() ? a : host;
  return static_cast<std::int64_t>(fnv1a(std::span(static_cast<const std::uint8_t*>(h.raw_data()), h.nbytes())));
}

// "cpu:3 (x 1, y 1)": any device of the mesh, by its position.
std::string global_label(const Mesh& mesh, int id) {
  const std::vector<int> at = mesh.coords(id);
  std::string s = mesh.devices()[static_cast<std::size_t>(id)].str() + " (";
  for (std::size_t k = 0; k < mesh.axes().size(); ++k)
    s += (k ? ", " : "") + mesh.axes()[k].name + " " + std::to_string(at[k]);
  return s + ")";
}

// The leaves a device returned, as one hash: paths, dtypes and shapes, and the scalar leaves' paths.
std::int64_t structure_hash(const OutputLeaves& o) {
  std::uint64_t h = kFnvOffsetBasis;
  for (std::size_t i = 0; i < o.arrays.size(); ++i) h = fnv1a(o.paths[i] + "=" + o.arrays[i]->signature() + ";", h);
  for (const auto& [path, bytes] : o.scalars) h = fnv1a(path + ";", h);
  return static_cast<std::int64_t>(h);
}

// A mesh spanning processes. Round 1 gathers, per device, whether this process's own checks passed and a hash
// of its tree's leaves and shapes; round 2 (when all agree) every block's and scalar's hash, so each process
// compares all of them and every process raises the same error. A process whose own checks failed still
// takes part, then raises its error; the others raise naming it.
void compare_across_processes(const Mesh& mesh, const std::vector<std::string>& paths, const std::vector<P>& specs,
                              const std::vector<OutputLeaves>& devices, const std::exception_ptr& local,
                              const std::vector<Split>& splits) {
  std::vector<std::vector<std::int64_t>> round1;
  for (const OutputLeaves& o : devices) round1.push_back({local ? 1 : 0, local ? 0 : structure_hash(o)});
  const std::vector<std::int64_t> agreed = distributed::process_allgather(mesh, round1);
  if (local) std::rethrow_exception(local);
  const int n = mesh.size();
  for (int g = 0; g < n; ++g)
    if (agreed[2 * static_cast<std::size_t>(g)] != 0)
      throw ValueError("shard_map: the outputs of process " +
                       std::to_string(mesh.devices()[static_cast<std::size_t>(g)].process) + " (" +
                       global_label(mesh, g) + ") failed its checks: see its error");
  for (int g = 1; g < n; ++g)
    if (agreed[2 * static_cast<std::size_t>(g) + 1] != agreed[1])
      throw ShapeError("shard_map: " + global_label(mesh, g) + " returned other leaves, dtypes or block shapes than " +
                       global_label(mesh, 0) + "; every device's blocks of an output have one shape and dtype");
  const std::size_t leaves = paths.size() + devices[0].scalars.size();
  std::vector<std::vector<std::int64_t>> mine;
  for (const OutputLeaves& o : devices) {
    std::vector<std::int64_t> h;
    for (const Array* a : o.arrays) h.push_back(hash_of(*a));
    for (const auto& [path, bytes] : o.scalars) h.push_back(static_cast<std::int64_t>(fnv1a(bytes)));
    mine.push_back(std::move(h));
  }
  const std::vector<std::int64_t> all = distributed::process_allgather(mesh, mine);
  auto at = [&](int g, std::size_t i) { return all[static_cast<std::size_t>(g) * leaves + i]; };
  for (std::size_t k = 0; k < devices[0].scalars.size(); ++k)
    for (int g = 1; g < n; ++g)
      if (at(g, paths.size() + k) != at(0, paths.size() + k))
        raise_scalar(devices[0].scalars[k].first, global_label(mesh, 0), global_label(mesh, g));
  for (std::size_t i = 0; i < paths.size(); ++i) {
    std::vector<std::vector<int>> index(static_cast<std::size_t>(n));
    for (int g = 0; g < n; ++g)
      for (const AxisNames& axes : splits[i].axes)
        index[static_cast<std::size_t>(g)].push_back(axes.empty() ? 0 : mesh.impl().axis_index(g, axes));
    for (int g = 1; g < n; ++g) {
      int e = 0;
      while (e < g && index[static_cast<std::size_t>(e)] != index[static_cast<std::size_t>(g)]) ++e;
      if (e == g || at(e, i) == at(g, i)) continue;
      std::string axes;
      const std::vector<int> ce = mesh.coords(e), cg = mesh.coords(g);
      for (std::size_t k = 0; k < mesh.axes().size(); ++k)
        if (ce[k] != cg[k]) axes += (axes.empty() ? "'" : ", '") + mesh.axes()[k].name + "'";
      raise_unequal(paths[i], devices[0].arrays[i]->signature(), specs[i], global_label(mesh, e),
                    global_label(mesh, g), axes, " (their bits differ: compared by hash across the processes)");
    }
  }
}

}  // namespace

void check_outputs(const Mesh& mesh, const std::vector<std::string>& paths, const std::vector<P>& specs,
                   const std::vector<OutputLeaves>& devices, bool compare) {
  if (compare && mesh.local_size() != mesh.size()) {
    std::exception_ptr local;
    std::vector<Split> splits;
    try {
      check_structure(mesh, paths, devices);
      splits = splits_of(mesh, paths, specs, devices[0]);
    } catch (...) {
      local = std::current_exception();
    }
    return compare_across_processes(mesh, paths, specs, devices, local, splits);
  }
  check_structure(mesh, paths, devices);
  const std::vector<Split> splits = splits_of(mesh, paths, specs, devices[0]);
  if (!compare) return;
  for (std::size_t d = 1; d < devices.size(); ++d)
    for (std::size_t k = 0; k < devices[0].scalars.size(); ++k)
      if (devices[d].scalars[k].second != devices[0].scalars[k].second)
        raise_scalar(devices[0].scalars[k].first, device_label(mesh, 0), device_label(mesh, d));
  for (std::size_t i = 0; i < paths.size(); ++i) {
    std::vector<const Array*> blocks;
    for (const OutputLeaves& o : devices) blocks.push_back(o.arrays[i]);
    compare_local(mesh, paths[i], specs[i], splits[i], blocks);
  }
}

}  // namespace detail

}  // namespace pmap
