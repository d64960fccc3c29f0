// P: a PartitionSpec, JAX's jax.sharding.PartitionSpec. Per array dimension, the mesh axes the dimension is
// split over: one axis ("data"), a tuple of axes ({"data", "model"}: split over both, the first axis
// major), or pmap::none (not split). Dimensions past the spec's end are not split, so P() replicates.
//
//   pmap::P("data", pmap::none)            // JAX: P('data', None): rows over "data", columns whole
//   pmap::P(pmap::none, "model")           // columns over "model" (a column-parallel kernel)
//   pmap::P(pmap::AxisNames{"data", "model"})  // rows over every device of a 2-D mesh
//
// A device's block along a dimension is its index along that dimension's axes; devices that differ only
// along axes the spec does not name hold the same block (the value is replicated along those axes).
// pmap::shard / unshard (transfer.h) split and assemble trees by specs.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/mesh.h>

namespace pmap {

// pmap::none: JAX's None. In a P, a dimension that is not split; in vmap's in_axes, an argument every member
// reads.
inline constexpr std::nullopt_t none = std::nullopt;

// What one entry of a P may be given as.
template <class D>
concept SpecEntry = !std::is_same_v<std::remove_cvref_t<D>, std::nullptr_t> &&
                    (std::is_same_v<std::remove_cvref_t<D>, std::nullopt_t> || std::is_convertible_v<D, std::string> ||
                     std::is_same_v<std::remove_cvref_t<D>, AxisNames>);

class P {
 public:
  P() = default;  // replicated
  // One entry per dimension: an axis name, an AxisNames tuple, or pmap::none.
  template <SpecEntry... Dims> explicit P(Dims&&... dims) { (add(std::forward<Dims>(dims)), ...); }
  // From a list of entries built at run time. (Not a constructor: P({"data", "model"}) would then be two
  // dimensions, where JAX's P(("data", "model"),) is one split over both axes.)
  static P from_dims(std::vector<AxisNames> dims) {
    P p;
    p.dims_ = std::move(dims);
    return p;
  }

  // Per dimension, the axes it is split over (empty: not split); as many entries as were given.
  const std::vector<AxisNames>& dims() const { return dims_; }
  std::size_t size() const { return dims_.size(); }
  // The axes dimension `dim` is split over; empty past the end.
  AxisNames axes_of(std::size_t dim) const { return dim < dims_.size() ? dims_[dim] : AxisNames(); }
  bool replicated() const;  // no dimension split
  // "P('data', None)", "P(('data', 'model'), None)", "P()": as JAX prints a spec.
  std::string str() const;

  friend bool operator==(const P& a, const P& b) { return a.dims_ == b.dims_; }

 private:
  void add(std::nullopt_t) { dims_.emplace_back(); }
  void add(AxisNames axes) { dims_.push_back(std::move(axes)); }
  template <class S> void add(S&& axis) requires std::is_convertible_v<S, std::string> {
    dims_.emplace_back(std::string(std::forward<S>(axis)));
  }
  std::vector<AxisNames> dims_;
};

// Specs by leaf path (tree.h's "/"-joined paths, as tree_for_each_with_path gives them: "Dense_0/kernel",
// "params/0"; "" for a lone Array): a leaf not named is replicated (P()), as in Keras's LayoutMap; shard,
// unshard and Feed raise ValueError for a path that names no Array leaf.
//   pmap::Specs{{"Dense_0/kernel", pmap::P(pmap::none, "model")}, {"Dense_0/bias", pmap::P("model")}}
// (A type of its own, not a std::map: shard(tree, mesh, {"data", "model"}) stays a tuple of axes.)
class Specs {
 public:
  Specs() = default;
  Specs(std::initializer_list<std::pair<const std::string, P>> entries) : by_path_(entries) {}
  void set(const std::string& path, P spec) { by_path_.insert_or_assign(path, std::move(spec)); }
  const std::map<std::string, P>& by_path() const { return by_path_; }

 private:
  std::map<std::string, P> by_path_;
};

// An Array leaf's path in its tree (as Specs names it) and the spec it was split by.
struct LeafSpec {
  std::string path;
  P spec;
};

}  // namespace pmap
