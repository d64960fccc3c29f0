// pmap: run a function written for one device on every device of a mesh at once, each on its own
// worker thread. Arguments of type Sharded<T> are mapped (device d gets its own T&); every other
// argument is broadcast (the same object, read-only, to every device: JAX's in_axes=None). The
// results come back as Sharded<R>. On a mesh spanning processes, the function runs on this process's
// devices and Sharded values hold their entries only (distributed.h). This header also pulls in the
// rest of the public API, shard_map (shard_map.h) included.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/backends.h>
#include <pmap/collectives.h>
#include <pmap/detail/task_ref.h>
#include <pmap/device.h>
#include <pmap/distributed.h>
#include <pmap/error.h>
#include <pmap/feed.h>
#include <pmap/mesh.h>
#include <pmap/random.h>
#include <pmap/sharded.h>
#include <pmap/transfer.h>
#include <pmap/tree.h>

namespace pmap {

namespace detail {

template <class A> decltype(auto) pick(A& arg, int device) {
  if constexpr (is_sharded_v<A>) {
    return (arg[static_cast<std::size_t>(device)]);
  } else {
    return std::as_const(arg);
  }
}

// Raises ShapeError when a mapped argument does not hold one entry per local device of the mesh,
// listing every mapped argument and its size. `sizes` holds (argument position, entries).
void check_mapped_sizes(const std::vector<std::pair<int, std::size_t>>& sizes, const Mesh& mesh);
// Raises AxisError unless `axes` is empty or names every axis of the mesh.
void check_pmap_axes(const Mesh& mesh, const AxisNames& axes);
// Runs fn(i) for every local device i of the mesh, each on its worker; blocks; rethrows the first failure.
void run_on_mesh(const Mesh& mesh, TaskRef fn);

}  // namespace detail

template <class F> class Pmapped {
 public:
  Pmapped(F fn, const Mesh& mesh, AxisNames axes) : fn_(std::move(fn)), mesh_(&mesh), axes_(std::move(axes)) {
    detail::check_pmap_axes(mesh, axes_);
  }

  // Runs the function on every (local) device; blocks until all are done. Returns Sharded<R> (or
  // nothing when the function returns void), one entry per local device. If any device throws,
  // collectives waiting on other devices raise Aborted, and the first original error is rethrown
  // here with its device attached.
  template <class... Args> auto operator()(Args&&... args) {
    std::vector<std::pair<int, std::size_t>> sizes;
    int position = 0;
    auto note = [&](const auto& a) {
      if constexpr (is_sharded_v<decltype(a)>) sizes.emplace_back(position, a.size());
      ++position;
    };
    (note(args), ...);
    (void)note;  // unused when there are no arguments
    detail::check_mapped_sizes(sizes, *mesh_);
    using R = std::invoke_result_t<F&, decltype(detail::pick(args, 0))...>;
    if constexpr (std::is_void_v<R>) {
      detail::run_on_mesh(*mesh_, [&]([[maybe_unused]] int d) {
        std::invoke(fn_, detail::pick(args, d)...);
      });
    } else {
      using V = std::decay_t<R>;
      std::vector<std::optional<V>> results(static_cast<std::size_t>(mesh_->local_size()));
      detail::run_on_mesh(*mesh_, [&]([[maybe_unused]] int d) {
        results[static_cast<std::size_t>(d)].emplace(std::invoke(fn_, detail::pick(args, d)...));
      });
      std::vector<V> out;
      out.reserve(results.size());
      for (auto& r : results) out.push_back(std::move(*r));
      return Sharded<V>(std::move(out));
    }
  }

 private:
  F fn_;
  const Mesh* mesh_;
  AxisNames axes_;
};

// pmap(fn, mesh) or pmap(fn, mesh, "ensemble") / {"data", "model"}: names the axes fn is mapped over
// (all of the mesh's axes; naming them documents and checks it). The mesh must outlive the result.
template <class F> Pmapped<std::decay_t<F>> pmap(F&& fn, const Mesh& mesh, AxisNames axes = {}) {
  return Pmapped<std::decay_t<F>>(std::forward<F>(fn), mesh, std::move(axes));
}

}  // namespace pmap

#include <pmap/shard_map.h>  // shard_map builds on Pmapped above
#include <pmap/padded.h>     // shard_padded: sizes that do not divide
