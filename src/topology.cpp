// A mesh's topology: axes and their validation, device coordinates, axis tuples (names resolved to axis
// ids, sizes, a device's index along a tuple) and the keys communicators are filed under.
#include "mesh_impl.h"

#include <algorithm>
#include <set>

#include <pmap/error.h>

namespace pmap {

std::string AxisNames::str() const {
  if (names_.size() == 1) return "'" + names_[0] + "'";
  std::string s = "(";
  for (std::size_t i = 0; i < names_.size(); ++i) s += (i ? ", '" : "'") + names_[i] + "'";
  return s + ")";
}

namespace detail {

void MeshImpl::validate() const {
  if (axes_.empty()) throw AxisError("Mesh: at least one axis is needed");
  if (axes_.size() > 4) throw AxisError("Mesh: at most 4 axes are supported, got " + std::to_string(axes_.size()));
  std::set<std::string> seen;
  long long total = 1;
  for (const auto& a : axes_) {
    if (a.name.empty()) throw AxisError("Mesh: axis names must not be empty");
    if (!seen.insert(a.name).second) throw AxisError("Mesh: axis '" + a.name + "' appears twice");
    if (a.size < 1) throw ShapeError("Mesh: axis '" + a.name + "' has size " + std::to_string(a.size));
    total *= a.size;
  }
  if (total != static_cast<long long>(devices_.size()))
    throw ShapeError("Mesh: axis sizes multiply to " + std::to_string(total) + " but " +
                     std::to_string(devices_.size()) + " devices were given");
  std::set<std::pair<int, int>> ids;
  for (const auto& d : devices_)
    if (!ids.insert({static_cast<int>(d.kind), d.index}).second)
      throw ValueError("Mesh: device " + d.str() + " appears twice");
  if (options_.collective_timeout.count() <= 0) throw ValueError("Mesh: collective_timeout must be positive");
  if (options_.process_timeout.count() < 0) throw ValueError("Mesh: process_timeout must not be negative");
}

std::vector<int> MeshImpl::coords(int device) const {
  std::vector<int> c(axes_.size());
  for (int a = static_cast<int>(axes_.size()) - 1; a >= 0; --a) {
    c[static_cast<std::size_t>(a)] = device % axes_[static_cast<std::size_t>(a)].size;
    device /= axes_[static_cast<std::size_t>(a)].size;
  }
  return c;
}

std::string MeshImpl::scope_str() const {
  std::string s;
  for (const auto& a : axes_) s += (s.empty() ? "'" : ", '") + a.name + "'";
  return s;
}

template <class F> void MeshImpl::for_each_axis(const AxisNames& axes, F&& f) const {
  if (axes.empty()) {
    for (std::size_t i = 0; i < axes_.size(); ++i) f(static_cast<int>(i));
    return;
  }
  unsigned seen = 0;  // a bit per axis id: a mesh has at most 4 axes (validate())
  for (const auto& n : axes.names()) {
    auto it = std::find_if(axes_.begin(), axes_.end(), [&](const AxisSpec& a) { return a.name == n; });
    if (it == axes_.end()) throw AxisError("unknown axis name '" + n + "'; axes in scope: " + scope_str());
    const int id = static_cast<int>(it - axes_.begin());
    if ((seen >> id & 1u) != 0) throw AxisError("axis '" + n + "' is named twice in " + axes.str());
    seen |= 1u << id;
    f(id);
  }
}

std::vector<int> MeshImpl::resolve(const AxisNames& axes) const {
  std::vector<int> ids;
  for_each_axis(axes, [&](int id) { ids.push_back(id); });
  return ids;
}

int MeshImpl::axis_size(const AxisNames& axes) const {
  int n = 1;
  for (int id : resolve(axes)) n *= axes_[static_cast<std::size_t>(id)].size;
  return n;
}

int MeshImpl::axis_index(int device, const AxisNames& axes) const {
  auto c = coords(device);
  int idx = 0;
  for (int id : resolve(axes)) idx = idx * axes_[static_cast<std::size_t>(id)].size + c[static_cast<std::size_t>(id)];
  return idx;
}

std::uint64_t MeshImpl::tuple_key(const std::vector<int>& axis_ids) const {
  std::uint64_t key = 0;
  for (int id : axis_ids) key = key * (axes_.size() + 1) + static_cast<std::uint64_t>(id) + 1;
  return key;
}

std::uint64_t MeshImpl::tuple_key(const AxisNames& axes) const {
  std::uint64_t key = 0;  // as the overload above, without building the vector of ids
  for_each_axis(axes, [&](int id) { key = key * (axes_.size() + 1) + static_cast<std::uint64_t>(id) + 1; });
  return key;
}

}  // namespace detail
}  // namespace pmap
