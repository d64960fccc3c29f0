// pmap's host-side checks and the bridge from the header templates to the mesh's run loop.
#include <pmap/pmap.h>

#include <algorithm>

#include "mesh_impl.h"

namespace pmap::detail {

void check_mapped_sizes(const std::vector<std::pair<int, std::size_t>>& sizes, const Mesh& mesh) {
  const int devices = mesh.local_size();
  bool ok = std::all_of(sizes.begin(), sizes.end(),
                        [&](const auto& s) { return s.second == static_cast<std::size_t>(devices); });
  if (ok) return;
  std::string msg = "pmap got inconsistent sizes for mapped arguments (the mesh has " + std::to_string(devices) +
                    (devices == mesh.size() ? " devices):" : " devices in this process):");
  for (const auto& [pos, n] : sizes) msg += " argument " + std::to_string(pos) + " has " + std::to_string(n) + ";";
  msg.pop_back();
  throw ShapeError(msg);
}

void check_pmap_axes(const Mesh& mesh, const AxisNames& axes) {
  if (axes.empty()) return;
  auto ids = mesh.impl().resolve(axes);  // raises AxisError on unknown names
  if (ids.size() != mesh.axes().size())
    throw AxisError("pmap over " + axes.str() + " on " + mesh.str() +
                    ": pmap runs on every device of the mesh, so name every axis (" + mesh.impl().scope_str() +
                    ") or none");
}

void run_on_mesh(const Mesh& mesh, TaskRef fn) { mesh.impl().run(fn); }

}  // namespace pmap::detail
