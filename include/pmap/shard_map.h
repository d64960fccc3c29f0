// shard_map: JAX's jax.shard_map(f, mesh=, in_specs=, out_specs=). f is written for one device's blocks: each
// argument is split as its in spec says, f runs on every device of the mesh (over all of its axes, as pmap
// does: collectives inside name the mesh's axes), and its result is assembled from the devices' blocks as the
// out specs say. An axis an out spec does not name is a promise that the output is the same along it (psum'd
// or pmean'd over it, or computed only from values replicated along it). With ShardMapOptions::check (on by
// default; JAX's check_vma, here checked on the values) every device's block of every output is compared bit
// for bit with those of the devices that hold the same block, and a difference raises ValueError naming the
// output, the two devices and the axes.
//
//   pmap::Mesh mesh(devices, {{"data", 2}, {"model", 2}});
//   auto matmul = pmap::shard_map([](const Array& x, const Array& w) {
//     return pmap::psum(ops::matmul(x, w), "model");  // a block of rows, summed over the split K
//   }, mesh, {P("data", "model"), P("model", pmap::none)}, P("data", pmap::none));
//   Array y = matmul(x, w);                           // x (B, K), w (K, N): y = x w, (B, N)
//
// The specs of one argument (a TreeSpec) are one P for every Array leaf of its tree, or pmap::Specs by leaf
// path (tree.h's paths; a leaf not named is replicated). An argument is a whole tree (on the host or on any
// device: it is split onto the mesh's devices), or a Sharded value that shard or sharded() made on this mesh with
// the same specs, used as it is; its leaves that are not Arrays reach every device as they are. f returns a tree:
// operator() gives it whole, in host memory; sharded() gives the devices' blocks as a Sharded value that knows
// its specs, so a training loop can pass one call's result to the next without the host.
// On a mesh spanning processes f runs on this process's devices, and operator() needs every block of the result
// on a local device (sharded() does not); the check compares every device's blocks by a hash gathered onto
// every process, so each process raises the same error.
// Differentiable both ways (pmapcc/core/grad.h): pmap::grad inside f's body (its collectives have transposes), and
// grad of a function that calls shard_map(...)(args) on values grad traces. The second is JAX's transpose of
// shard_map: f runs once on each device under a trace of its own, kept until the backward pass, which is a
// shard_map of those traces' backward passes. Each trace knows along which mesh axes each value varies (an
// argument leaf, of any dtype, along the axes its in spec names; a result along its operands', less those a
// psum, pmean, pmax, pmin or all_gather makes the same; a value f captures or computes from no argument, such
// as one derived from axis_index, is taken to be the same on every device) and sums a cotangent over the axes
// along which its value met values that vary more (JAX's implicit pvary, whose transpose is psum). So a weight
// replicated over "data" and used with each device's rows gets the whole batch's gradient, with no pmean in f.
// As JAX's check_vma, an output that varies along an axis its out spec does not name raises ValueError (its
// cotangent would count once per device). The mesh must outlive the backward pass; grad inside f is then
// higher order (NotAvailable). sharded() of traced values, a traced argument beside a Sharded one, and vmap of a
// function that calls shard_map are not supported: an argument they trace raises NotAvailable naming it.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <pmap/detail/trace.h>
#include <pmap/pmap.h>

namespace pmap {

// The specs of one tree: one P for every Array leaf, or Specs by leaf path.
class TreeSpec {
 public:
  TreeSpec(P spec) : spec_(std::move(spec)) {}            // NOLINT: implicit, as JAX takes a bare P
  TreeSpec(Specs by_path) : spec_(std::move(by_path)) {}  // NOLINT
  // Per Array leaf (`paths`, in tree order), its spec; a path Specs names that is not a leaf raises
  // ValueError starting with `who`.
  std::vector<P> of_leaves(const std::vector<std::string>& paths, const std::string& who) const;
  // As Specs, for shard.
  Specs by_path(const std::vector<std::string>& paths) const;

 private:
  std::variant<P, Specs> spec_;
};

struct ShardMapOptions {
  // Compare the blocks of each output along the axes its spec does not name, bit for bit (JAX's check_vma).
  // It copies every device's blocks to the host once; turn it off in a loop whose body is known to keep
  // its promises.
  bool check = true;
};

namespace detail {

// ValueError unless there is one in spec per argument.
void check_in_spec_count(std::size_t specs, std::size_t arguments);
// The checks on a Sharded argument (`index`: its position): one entry per local device, split on this mesh
// (`made_on`: Sharded::mesh()), each entry's arrays on its device (`devices[d]`: entry d's leaves' devices).
void check_sharded_entries(std::size_t index, std::size_t entries, const std::string& made_on,
                           const std::vector<std::vector<Device>>& devices, const Mesh& mesh);
// Its specs equal to `want`, leaf by leaf.
void check_sharded_specs(std::size_t index, const std::vector<LeafSpec>& have, const std::vector<std::string>& paths,
                         const std::vector<P>& want);

// One device's output tree, flattened: its Array leaves and their paths, and the bytes of its scalar leaves by
// path.
struct OutputLeaves {
  std::vector<const Array*> arrays;
  std::vector<std::string> paths;
  std::vector<std::pair<std::string, std::string>> scalars;
};
// Checks the outputs of every local device against the out specs (`paths`: the Array leaves' paths, `specs`
// their specs): the same tree on every device, blocks of one shape and dtype that the specs can assemble,
// and, with `compare`, equal bits wherever two devices hold the same block and equal scalar leaves.
void check_outputs(const Mesh& mesh, const std::vector<std::string>& paths, const std::vector<P>& specs,
                   const std::vector<OutputLeaves>& devices, bool compare);

// What f's parameter sees of an argument of type A: a device's tree.
template <class A> struct block_of { using type = A; };
template <class T> struct block_of<Sharded<T>> { using type = T; };
template <class A> using block_t = typename block_of<A>::type;

// NotAvailable for argument `index`'s leaf at `path`, a value that vmap traces (`batched`), or one grad traces
// given to sharded() or beside a Sharded argument: the blocks f would see are copies the transformation does
// not follow.
[[noreturn]] void refuse_traced(std::size_t index, const std::string& path, bool batched);
template <class T> void check_untraced(std::size_t index, const T& tree) {
  tree_for_each_with_path(tree, [&](const std::string& path, const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>)
      if (trace_tag(leaf) != 0) refuse_traced(index, path, (trace_tag(leaf) & kBatchedTag) != 0);
  });
}
// NotAvailable for a leaf vmap traces.
template <class T> void check_batched(std::size_t index, const T& tree) {
  tree_for_each_with_path(tree, [&](const std::string& path, const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>)
      if ((trace_tag(leaf) & kBatchedTag) != 0) refuse_traced(index, path, true);
  });
}
// Whether a leaf of the tree is a value grad traces (not vmap: check_untraced refuses those).
template <class T> bool grad_traced(const T& tree) {
  bool any = false;
  tree_for_each(tree, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>)
      any = any || (trace_tag(leaf) != 0 && (trace_tag(leaf) & kBatchedTag) == 0);
  });
  return any;
}
// The tree's Array leaves, in order, moved out of it.
template <class T> std::vector<Array> take_leaves(T& tree) {
  std::vector<Array> out;
  tree_for_each(tree, [&](auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) out.push_back(std::move(leaf));
  });
  return out;
}
// The tree's structure: its scalar leaves, and empty Arrays in place of its Array leaves.
template <class T> T structure_of(const T& tree) {
  return tree_map(tree, [](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return Array();
    } else {
      return leaf;
    }
  });
}
// The structure with its Array leaves taken from leaves[k], leaves[k + 1], ... (moved; k advanced past them).
template <class T> T with_leaves(const T& structure, std::vector<Array>& leaves, std::size_t& k) {
  return tree_map(structure, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      return std::move(leaves.at(k++));
    } else {
      return leaf;
    }
  });
}
// A view of x's storage with x's trace tag (x outlives it): what f's parameters are built of on the grad path.
Array leaf_view(const Array& x);
// The structure of the output of the first device in mesh order that ran f, for the grad path, where f runs on
// the devices' threads.
template <class T> class FirstOutput {
 public:
  void keep(int index, const T& tree) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_ && kept_->first <= index) return;
    kept_.emplace(index, structure_of(tree));
  }
  T get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!kept_) throw Error("shard_map: f ran on no device");
    return structure_of(kept_->second);
  }

 private:
  mutable std::mutex mutex_;
  std::optional<std::pair<int, T>> kept_;
};

template <class T> OutputLeaves output_leaves(const T& tree) {
  OutputLeaves out;
  tree_for_each_with_path(tree, [&](const std::string& path, const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      out.arrays.push_back(&leaf);
      out.paths.push_back(path);
    } else {
      out.scalars.emplace_back(path, std::string(reinterpret_cast<const char*>(&leaf), sizeof(leaf)));
    }
  });
  return out;
}

}  // namespace detail

template <class F> class ShardMapped {
 public:
  ShardMapped(F fn, const Mesh& mesh, std::vector<TreeSpec> in_specs, TreeSpec out_specs, ShardMapOptions options)
      : fn_(std::make_shared<F>(std::move(fn))), mesh_(&mesh), in_(std::move(in_specs)), out_(std::move(out_specs)),
        options_(options) {}

  // f's result, assembled whole in host memory. Differentiable: with arguments grad traces, the call is recorded
  // with each device's trace of f, and its backward pass is a shard_map of theirs (see above).
  template <class... Args> auto operator()(const Args&... args) {
    if constexpr ((!is_sharded_v<Args> && ...)) {
      if ((detail::grad_traced(args) || ...)) return traced(std::index_sequence_for<Args...>{}, args...);
    }
    auto blocks = sharded(args...);
    return unshard(blocks, *mesh_);
  }

  // f's result as the devices' blocks, knowing the out specs (unshard(result, mesh) assembles it).
  template <class... Args> auto sharded(const Args&... args) {
    detail::check_in_spec_count(in_.size(), sizeof...(Args));
    return run(std::index_sequence_for<Args...>{}, args...);
  }

 private:
  template <std::size_t... I, class... Args> auto run(std::index_sequence<I...>, const Args&... args) {
    // Braced: the arguments are split left to right.
    std::tuple<decltype(blocks_of<I>(args))...> blocks{blocks_of<I>(args)...};
    static_assert(!std::is_void_v<std::invoke_result_t<F&, const detail::block_t<Args>&...>>,
                  "shard_map: f must return a tree (its result is assembled by out_specs)");
    auto out = std::apply([&](const auto&... b) { return pmap(std::ref(*fn_), *mesh_)(b...); }, blocks);
    using V = std::remove_cvref_t<decltype(out[0])>;
    const std::vector<std::string> paths = detail::array_paths(out[0]);
    const std::vector<P> specs = out_.of_leaves(paths, "shard_map: out_specs");  // checks the paths
    std::vector<detail::OutputLeaves> leaves;
    for (const V& tree : out) leaves.push_back(detail::output_leaves(tree));
    detail::check_outputs(*mesh_, paths, specs, leaves, options_.check);
    std::vector<LeafSpec> leaf_specs;
    for (std::size_t i = 0; i < paths.size(); ++i) leaf_specs.push_back({paths[i], specs[i]});
    return Sharded<V>(std::move(out.values()), std::move(leaf_specs), detail::mesh_identity(*mesh_));
  }

  // The call on values grad traces, handed to the core as its Array leaves (each with its in spec) and a body
  // that rebuilds the arguments' trees from one device's blocks; the result rebuilt from the core's whole
  // output leaves. f and the argument trees' structures are shared with the body (the recorded call holds it).
  template <std::size_t... I, class... Args> auto traced(std::index_sequence<I...>, const Args&... args) {
    detail::check_in_spec_count(in_.size(), sizeof...(Args));
    (detail::check_batched(I, args), ...);
    using Out = std::remove_cvref_t<std::invoke_result_t<F&, const Args&...>>;
    static_assert(!std::is_void_v<Out>, "shard_map: f must return a tree (its result is assembled by out_specs)");
    detail::TracedShardMap call;
    call.mesh = mesh_;
    call.check = options_.check;
    std::vector<const Array*> leaves;
    auto flatten = [&](std::size_t index, const auto& arg) {
      const std::vector<std::string> paths = detail::array_paths(arg);
      for (P& p : in_[index].of_leaves(paths, "shard_map: argument " + std::to_string(index)))
        call.in_specs.push_back(std::move(p));
      tree_for_each(arg, [&](const auto& leaf) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) leaves.push_back(&leaf);
      });
    };
    (flatten(I, args), ...);
    auto trees = std::make_shared<const std::tuple<Args...>>(detail::structure_of(args)...);
    auto first = std::make_shared<detail::FirstOutput<Out>>();
    std::vector<std::string> names;
    for (const AxisSpec& a : mesh_->axes()) names.push_back(a.name);
    call.body = [fn = fn_, trees, first, all = AxisNames(std::move(names))](const std::vector<Array>& blocks) {
      std::vector<Array> views;
      for (const Array& b : blocks) views.push_back(detail::leaf_view(b));
      std::size_t k = 0;
      // Braced: the trees take their blocks left to right.
      const std::tuple<Args...> mine{detail::with_leaves(std::get<I>(*trees), views, k)...};
      Out out = std::apply(*fn, mine);
      first->keep(axis_index(all), out);
      return detail::take_leaves(out);
    };
    call.out_specs = [spec = out_, first] {
      return spec.of_leaves(detail::array_paths(first->get()), "shard_map: out_specs");
    };
    const detail::TracedShardMapHandler handler = detail::traced_shard_map_handler();
    if (handler == nullptr) throw Error("shard_map: a value grad traces, but no grad is linked to differentiate it");
    std::vector<Array> whole = handler(call, leaves);
    std::size_t k = 0;
    return detail::with_leaves(first->get(), whole, k);
  }

  // A whole tree split by in spec I (a new Sharded value); a Sharded argument checked and passed on.
  template <std::size_t I, class A> decltype(auto) blocks_of(const A& arg) {
    const std::string who = "shard_map: argument " + std::to_string(I);
    if constexpr (is_sharded_v<A>) {
      for (std::size_t d = 0; d < arg.size(); ++d) detail::check_untraced(I, arg[d]);
      std::vector<std::vector<Device>> devices(arg.size());
      for (std::size_t d = 0; d < arg.size(); ++d)
        tree_for_each(arg[d], [&](const auto& leaf) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) devices[d].push_back(leaf.device());
        });
      detail::check_sharded_entries(I, arg.size(), arg.mesh(), devices, *mesh_);
      const std::vector<std::string> paths = detail::array_paths(arg[0]);
      detail::check_sharded_specs(I, arg.specs(), paths, in_[I].of_leaves(paths, who));
      return static_cast<const A&>(arg);
    } else {
      detail::check_untraced(I, arg);
      const std::vector<std::string> paths = detail::array_paths(arg);
      return detail::shard_as(who.c_str(), arg, *mesh_, in_[I].by_path(paths));
    }
  }

  std::shared_ptr<F> fn_;  // shared with a recorded call's body, which outlives a temporary ShardMapped
  const Mesh* mesh_;
  std::vector<TreeSpec> in_;
  TreeSpec out_;
  ShardMapOptions options_;
};

// shard_map(f, mesh, in_specs, out_specs[, options]): one TreeSpec per argument of f (a P, or Specs by leaf
// path), one for its result. The mesh must outlive the result.
template <class F>
ShardMapped<std::decay_t<F>> shard_map(F&& fn, const Mesh& mesh, std::vector<TreeSpec> in_specs, TreeSpec out_specs,
                                       ShardMapOptions options = {}) {
  return ShardMapped<std::decay_t<F>>(std::forward<F>(fn), mesh, std::move(in_specs), std::move(out_specs), options);
}

}  // namespace pmap
