// Sharded<T>: one T per device of a mesh, in the mesh's device order. pmap maps over Sharded
// arguments and returns Sharded results. A value made by shard with specs, or popped from a Feed partitioned
// by specs, knows them (unshard reads them); pmap's results do not.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/partition.h>

namespace pmap {

template <class T> class Sharded {
 public:
  Sharded() = default;
  explicit Sharded(std::vector<T> values) : values_(std::move(values)) {}
  Sharded(std::vector<T> values, std::vector<LeafSpec> specs, std::string mesh = {})
      : values_(std::move(values)), specs_(std::move(specs)), mesh_(std::move(mesh)) {}

  std::size_t size() const { return values_.size(); }
  T& operator[](std::size_t device) { return values_[device]; }
  const T& operator[](std::size_t device) const { return values_[device]; }
  auto begin() { return values_.begin(); }
  auto end() { return values_.end(); }
  auto begin() const { return values_.begin(); }
  auto end() const { return values_.end(); }
  std::vector<T>& values() { return values_; }
  const std::vector<T>& values() const { return values_; }
  // How it was split: each Array leaf's path and spec, in tree order. Empty for a value not made by specs
  // (pmap's results, replicate, shard over the leading axis).
  const std::vector<LeafSpec>& specs() const { return specs_; }
  // The mesh it was split on (its axes and every device, in order) when shard by specs or shard_map made it;
  // else empty. shard_map refuses a value split on another mesh.
  const std::string& mesh() const { return mesh_; }

 private:
  std::vector<T> values_;
  std::vector<LeafSpec> specs_;
  std::string mesh_;
};

template <class T> struct is_sharded : std::false_type {};
template <class T> struct is_sharded<Sharded<T>> : std::true_type {};
template <class T> inline constexpr bool is_sharded_v = is_sharded<std::remove_cvref_t<T>>::value;

}  // namespace pmap
