// Named-axis collectives, called inside a function run by pmap. They are SPMD: every device of the
// named axes calls the same collective, in the same order, with the same shape and dtype; a device
// that does otherwise makes every device raise CollectiveMismatch instead of hanging.
// `axes` is one axis name or a tuple ({"data", "model"}); an unknown name raises AxisError.
// CPU results reduce in device order 0..n-1, so they are bitwise identical on every device.
// Array versions return a new array on the calling device; *_inplace versions overwrite x.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/communicator.h>
#include <pmap/mesh.h>
#include <pmap/tree.h>

namespace pmap {

int axis_index(const AxisNames& axes);  // this device's index along the axes (row-major over a tuple)
int axis_size(const AxisNames& axes);   // number of devices along the axes
Device current_device();                // the device the calling pmapped function runs on
// The CUDA stream of the calling pmapped function's device, as a cudaStream_t (cast it): launch your own
// kernels and library calls on it to order them with pmapcc's work there (pmapcc::kernels' ops, copies,
// collectives); pmap waits for it before it returns. Virtual devices sharing a GPU each have their own.
// ValueError on a CPU device; Error outside pmap.
void* cuda_stream();
// How many collectives (of any kind, over any axes) the calling device has entered so far in the current
// pmap call: what a step costs in collectives, for tests and profiling.
std::uint64_t collectives_entered();

Array psum(const Array& x, const AxisNames& axes);
Array pmean(const Array& x, const AxisNames& axes);  // floating dtypes only (ValueError otherwise)
// pmax/pmin: a NaN on any device makes the element NaN, on every kind of device. Over NCCL (one device per
// GPU, 2 or more GPUs), whose own float max/min drop NaN, floats are reduced as order keys (NaN winning) and
// come back as they went, a NaN as the canonical quiet NaN; -0 and +0 are ordered there (max +0, min -0),
// where the hubs keep either. (Not yet run on several GPUs; the keys are checked on the host.)
Array pmax(const Array& x, const AxisNames& axes);
Array pmin(const Array& x, const AxisNames& axes);
// The weighted mean over the devices: the sum of weight_d * x_d over the devices, divided by the sum of
// their weights (x floating; the weight and the sum are rounded to x's dtype, exact for f32 up to 2^24). For
// blocks that shard_padded (padded.h) padded, a mean over each device's real rows weighted by its real row
// count (Padded::count) is the mean over every real row. Weights must be finite and non-negative
// (ValueError), and not all 0; a device of weight 0 adds nothing, even a NaN (the mean of no rows). Not inside
// grad or vmap (ValueError): inside grad, divide the loss's sum by psum(count) and psum the gradients, which
// gives the same mean. The trees' overload sums the weights once for all the leaves.
Array pmean(const Array& x, const AxisNames& axes, double weight);
void psum_inplace(Array& x, const AxisNames& axes);
void pmean_inplace(Array& x, const AxisNames& axes);
void pmax_inplace(Array& x, const AxisNames& axes);
void pmin_inplace(Array& x, const AxisNames& axes);
// Stacked: shape (n, *x.shape). Tiled: the leading axes concatenated, (n * x.shape[0], ...).
Array all_gather(const Array& x, const AxisNames& axes, bool tiled = false);
// Along `axis`, as JAX's all_gather(x, axis_name, axis=axis, tiled=tiled). Stacked: a new axis of size n at
// position `axis` of the result (0..x.ndim()); tiled: the devices' blocks concatenated along x's axis
// `axis` (0..x.ndim()-1). A negative axis counts from the end (-1: the last). ShapeError otherwise.
Array all_gather(const Array& x, const AxisNames& axes, int axis, bool tiled = false);
// Sums over the axes and keeps this device's block of the leading axis. Not tiled: x.shape[0] must be
// n and the result has shape x.shape[1:]. Tiled: x.shape[0] divisible by n; result (x.shape[0]/n, ...).
Array psum_scatter(const Array& x, const AxisNames& axes, bool tiled = false);
// JAX's all_to_all(x, axis_name, split_axis, concat_axis, tiled=tiled): x's axis split_axis is cut into n
// chunks (n: the devices along the axes), chunk j goes to device j, and the n chunks a device receives are
// put along concat_axis in device order. Not tiled: x.shape[split_axis] must be n; the result drops that axis
// and has a new one of size n at concat_axis (0..x.ndim()-1 of the result). Tiled: x.shape[split_axis]
// divisible by n; the result has x's rank, split_axis divided by n and concat_axis multiplied by n (the
// same axis may be both). Negative axes count from the end. ShapeError naming the axis otherwise. Its
// gradient is the all_to_all of the cotangent with the two axes swapped. Today it gathers every device's x
// (all_gather, on every transport) and keeps its own chunks: n times the traffic and memory of a native
// exchange; the results are the same bits.
Array all_to_all(const Array& x, const AxisNames& axes, int split_axis, int concat_axis, bool tiled = false);
// Sends x from device src to device dst for each (src, dst) pair (indices along the axes); devices that
// receive nothing get zeros. Sources and destinations must each be unique.
Array ppermute(const Array& x, const AxisNames& axes, const std::vector<std::pair<int, int>>& perm);
// Waits until every device of the axes has arrived.
void barrier(const AxisNames& axes);

// Scalars.
template <ScalarLeaf T> T psum(T x, const AxisNames& axes) { return psum(Array::scalar(x), axes).template item<T>(); }
template <ScalarLeaf T> T pmax(T x, const AxisNames& axes) { return pmax(Array::scalar(x), axes).template item<T>(); }
template <ScalarLeaf T> T pmin(T x, const AxisNames& axes) { return pmin(Array::scalar(x), axes).template item<T>(); }
template <ScalarLeaf T> T pmean(T x, const AxisNames& axes) {
  static_assert(std::is_floating_point_v<T>, "pmean needs a floating-point value");
  return pmean(Array::scalar(x), axes).template item<T>();
}
template <ScalarLeaf T> T pmean(T x, const AxisNames& axes, double weight) {
  static_assert(std::is_floating_point_v<T>, "pmean needs a floating-point value");
  return pmean(Array::scalar(x), axes, weight).template item<T>();
}
template <ScalarLeaf T> std::vector<T> all_gather(T x, const AxisNames& axes) {
  return all_gather(Array::scalar(x), axes).template to_vector<T>();
}

// Trees: the collective applied to every leaf, in tree order.
#define PMAPCC_TREE_COLLECTIVE(name)                                                         \
  template <class T>                                                                         \
    requires(!Leaf<T>)                                                                       \
  T name(const T& tree, const AxisNames& axes) {                                             \
    return tree_map(tree, [&](const auto& leaf) { return name(leaf, axes); });              \
  }
PMAPCC_TREE_COLLECTIVE(psum)
PMAPCC_TREE_COLLECTIVE(pmean)
PMAPCC_TREE_COLLECTIVE(pmax)
PMAPCC_TREE_COLLECTIVE(pmin)
#undef PMAPCC_TREE_COLLECTIVE

namespace detail {
// The weights' sum over the axes, checked (pmean with weights).
double total_weight(double weight, const AxisNames& axes);
Array weighted_mean(const Array& x, const AxisNames& axes, double weight, double total);
}  // namespace detail
template <class T>
  requires(!Leaf<T>)
T pmean(const T& tree, const AxisNames& axes, double weight) {
  const double total = detail::total_weight(weight, axes);
  return tree_map(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return detail::weighted_mean(leaf, axes, weight, total);
    } else {
      using S = std::remove_cvref_t<decltype(leaf)>;
      static_assert(std::is_floating_point_v<S>, "pmean needs floating-point leaves");
      return detail::weighted_mean(Array::scalar(leaf), axes, weight, total).template item<S>();
    }
  });
}

namespace detail {
// psum_inplace (mean false) or pmean_inplace (true) of a tree's Array leaves, in tree order. On a mesh of CPU
// devices the leaves of one dtype are packed into one buffer (up to 64 MiB a pack), reduced by one collective
// and unpacked: one rendezvous for the tree instead of one a leaf, and the bits the leaf-by-leaf calls give
// (each element is the same sum, in the same device order, divided alike). On a mesh with GPUs leaf by leaf
// (NCCL's calls queue on the stream). A leaf the calls refuse (traced, an integer one under pmean) raises as
// they do, before any reduction; a failure during the reductions (a mismatch, a timeout) may leave some leaves
// reduced, as leaf-by-leaf calls would.
void reduce_leaves_inplace(const std::vector<Array*>& leaves, const AxisNames& axes, bool mean);
template <class T> std::vector<Array*> array_leaves(T& tree) {
  std::vector<Array*> out;
  tree_for_each(tree, [&](auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) out.push_back(&leaf);
  });
  return out;
}
}  // namespace detail

// A tree's Array leaves in place, packed into one collective on a mesh of CPU devices (above); its scalar leaves
// as psum and pmean of scalars.
template <class T>
  requires(!Leaf<T>)
void psum_inplace(T& tree, const AxisNames& axes) {
  detail::reduce_leaves_inplace(detail::array_leaves(tree), axes, false);
  tree_for_each(tree, [&](auto& leaf) {
    if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) leaf = psum(leaf, axes);
  });
}
template <class T>
  requires(!Leaf<T>)
void pmean_inplace(T& tree, const AxisNames& axes) {
  detail::reduce_leaves_inplace(detail::array_leaves(tree), axes, true);
  tree_for_each(tree, [&](auto& leaf) {
    if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) leaf = pmean(leaf, axes);
  });
}

// all_gather of a tree of Arrays (scalar leaves raise ShapeError: their gather is not a scalar).
template <class T>
  requires(!Leaf<T>)
T all_gather(const T& tree, const AxisNames& axes, bool tiled = false) {
  return tree_map(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return all_gather(leaf, axes, tiled);
    } else {
      throw ShapeError("all_gather of a tree with a scalar leaf: hold the scalar in an Array");
      return leaf;
    }
  });
}

}  // namespace pmap
