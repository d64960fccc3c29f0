// jit: JAX's jax.jit for a C++ function of trees of Arrays, as far as a program of eager ops allows. The
// first call with a new signature traces the function: it runs as usual while every Array it allocates is
// recorded with its lifetime, and the allocations are then planned into one arena per device (offsets
// reused once a buffer is dead, best fit; ggml's graph allocator does the same). Later calls with that
// signature replay the plan: the function runs again with the arena's places as its buffers, so nothing
// inside it allocates device or host memory for an Array (the kernels' scratch included).
//
//   auto step = pmap::jit(train_step, "train_step");        // train_step(state, batch) -> (state, metrics)
//   pmap::pmap([&](const TrainState& s0, const Batch& b) {
//     TrainState state = pmap::tree_copy(s0);
//     for (...) std::tie(state, m) = step(state, b);   // replays allocate only their results
//   }, mesh, "data");
//
// - The signature is every Array leaf's path, dtype, shape and device; scalar leaves and arguments that are
//   not trees (a bool) are not part of it (on a backend without graphs the function runs on every call, so
//   a learning rate may change). A new signature traces again (counted in stats().traces); a replay that
//   leaves its plan (the function allocated something the trace did not, in another order or size, or a
//   buffer was still alive where the plan reuses its place) takes the memory from the heap instead, so the
//   result is right, and the next call traces again (stats().retraces): never a silent reuse of live memory.
// - Results are the caller's: the plan leaves them out (they come from the heap, through the host cache on
//   CPU devices, and are handed over without a copy), so a replay allocates exactly its results' arrays.
//   (With graphs, below, they are placed in the plan and copied out into arrays of their own.)
// - Values computed inside the function must not outlive the call except as results (a buffer kept by a
//   reference would be overwritten by the next replay): one that does raises ValueError naming the function.
// - On the calling thread only: inside pmap, call the jitted function from the per-device function (each
//   device has its own plan); a pmap inside the jitted function runs unplanned on its devices' threads. An
//   Array the function makes must be freed on its thread (one freed elsewhere looks kept: ValueError).
//   A jit called inside another keeps its own plan (its results come from the heap on every call). A value
//   that escaped a replay keeps its arena for as long as the jitted function lives.
//   Inside grad or vmap (a traced argument) the function simply runs, as JAX inlines an inner jit. A
//   jitted function called again while it runs on the same signature (recursion) runs unplanned.
// - Graphs: on a backend that records graphs (CUDA devices; the host run of the CUDA kernels), the plan
//   also places the results, and a signature's second call on a thread with the same static values (below)
//   captures the function into a graph on copies of its arguments (fixed places, one per Array leaf). Later calls on that thread copy their
//   arguments there, launch the graph and copy the results out: the function's C++ does not run again (it
//   ran at the trace and at the capture; JAX runs a jitted function's Python once). So the function must
//   be pure: an Array of its closure is read where it was at the capture, so it must stay unchanged and
//   alive for as long as the jitted function is used (pass what changes as an argument); a result that is
//   such an Array is refused. Scalar leaves and the static arguments (a bool, a number, an enum, a string)
//   are compared on every call, and so is the ops::DefaultPrecision: a new value replays once without a
//   graph (making the handles and scratch it needs, which a capture cannot allocate), and the next call
//   with it captures again (stats().graph_captures), so a value that changes on every call (a host-side
//   schedule: pass it as an Array instead) never captures. Collectives are captured where the devices'
//   communicators can record them: NCCL (one device per GPU), and a one-device group's local copies; each
//   launch of such a graph then meets the group's other devices on the host first (a device doing
//   something else raises CollectiveMismatch instead of hanging on the GPU) and waits for the graph after,
//   with the mesh's collective timeout, and the mesh's communicators drop the graph before they are torn
//   down (NCCL waits for such graphs). A function the capture refuses (a collective over the host or the
//   virtual devices' hub, a second axis's collectives in one graph, a random draw into an array, a copy to
//   the host, a jitted function called inside: CaptureError; or CUDA ending the capture) is traced again
//   without a graph's plan and replays without a graph from then on, counted in stats().graph_refusals
//   with the reason in stats().graph_refusal; so is one with a static argument of another type, once per
//   trace. A capture refused on some devices only fails that call with CollectiveMismatch where the
//   others record a collective (NCCL: all or none), and every device then replays without a graph. A graph is launched on the thread that captured it: another
//   thread's first call replays, its second captures a graph of its own (one graph per signature: two
//   threads taking turns capture on every other call). JitOptions{.graphs = false} turns graphs off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <pmap/array.h>
#include <pmap/tree.h>

namespace pmap {

struct JitStats {
  std::uint64_t traces = 0;    // calls that traced: a new signature, or again after a replay left its plan
  std::uint64_t retraces = 0;  // of those, the ones after a replay left its plan (or threw)
  std::uint64_t replays = 0;   // calls that ran on a plan
  std::uint64_t diverged = 0;  // replays that left their plan
  std::uint64_t unplanned = 0;  // calls run as they are: inside grad or vmap, or recursive
  std::size_t signatures = 0;
  std::size_t arena_bytes = 0;  // every signature's arenas together
  // The latest planned call (trace or replay): Arrays allocated from the heap besides the results (0 on a
  // replay that keeps its plan), and the results' own arrays.
  std::uint64_t last_allocations = 0;
  std::uint64_t last_result_allocations = 0;
  // Graphs (a backend that records them; see above).
  std::uint64_t graph_captures = 0;  // graphs recorded: a signature's first replay, or again (a static
                                     // argument or scalar leaf changed, another thread, a retrace)
  std::uint64_t graph_launches = 0;  // calls that were one graph launch (with the copies in and out)
  std::uint64_t graph_refusals = 0;  // signatures that replay without a graph on such a backend
  std::string graph_refusal;         // the latest refusal's reason
};

struct JitOptions {
  bool graphs = true;  // replay as one graph where the backend records graphs
};

namespace jit_detail {

struct State;  // core/jit.cpp

std::shared_ptr<State> make_state(std::string name);
const std::string& name_of(const State& state);
JitStats stats_of(const State& state);
bool inside_transformation() noexcept;  // grad or vmap active on the calling thread
void count_unplanned(State& state) noexcept;

// One planned call: picks the signature's plan (or traces), installs the allocation hook for the function's
// run, and checks what is left when it returns.
// What a call asks of graphs: the static arguments' and scalar leaves' values (a launch needs the same),
// or why there can be none; the function's result type; the Array leaves of the arguments, in order.
struct GraphRequest {
  bool wanted = false;
  std::string key;
  std::string why_not;  // set: no graph for this call
  const std::type_info* result_type = nullptr;
  std::vector<const Array*> inputs;
};

class Call {
 public:
  Call(State& state, std::string signature, GraphRequest* graph = nullptr);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  bool planned() const { return entry_ != nullptr; }  // false: run the function as it is
  // The function returned `results` (its Array leaves): they become the caller's (a leaf in the arena or a
  // view is copied out), the hook is removed, and the call is planned (trace) or checked (replay).
  void finish(const std::vector<Array*>& results);

  // Graphs. launching(): the call is one launch of the signature's graph: launch() copies the arguments to
  // their places, launches, and returns the results' arrays (in leaf order) copied out of the plan, which
  // result_template() (a tree of the result type with empty Arrays) takes back into a tree.
  bool launching() const;
  std::vector<Array> launch();
  const void* result_template() const;
  // capturing(): the call records the graph. staged(i) is argument leaf i at its place (copied there);
  // capture() runs body (the function on the staged arguments, which hands its results to
  // captured_results() and frees them) under the backend's capture and returns true: launch() then runs
  // the graph and copies the results out; false: the backend refused the capture (the reason is kept), and
  // the call goes on as a plain replay: run the function and finish().
  bool capturing() const;
  Array staged(std::size_t i) const;
  bool capture(const std::function<void()>& body, std::shared_ptr<void> (*make_template)(void*));
  void captured_results(const std::vector<Array*>& results, void* result);

 private:
  struct Impl;
  State& state_;
  void* entry_ = nullptr;
  std::unique_ptr<Impl> impl_;
};

void add_signature(std::string& out, const std::string& where, const Array& a);
// Whether an argument is a tree (its outermost type): other arguments (a bool, a string) are static.
template <class T>
concept TreeArgument = Leaf<T> || detail::is_vector<T>::value || detail::is_std_array<T>::value ||
                       detail::is_map<T>::value || detail::is_tuple<T>::value || detail::is_pair<T>::value ||
                       detail::HasTreeFields<T>;

template <class T> void signature_of(std::string& out, const T& tree, std::size_t argnum) {
  if constexpr (TreeArgument<T>) tree_for_each_with_path(tree, [&](const std::string& path, const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) {
      add_signature(out, std::to_string(argnum) + "/" + path, leaf);
    }
  });
  out += ';';
}

template <class R> std::vector<Array*> result_leaves(R& result) {
  std::vector<Array*> out;
  tree_for_each(result, [&](auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) out.push_back(&leaf);
  });
  return out;
}

void add_key_bytes(std::string& out, const void* data, std::size_t n);
void add_key_string(std::string& out, std::string_view s);  // its length, then its bytes

// A graph launch cannot see a new value of what is not an Array: scalar leaves and static arguments (bool,
// numbers, enums, strings) are compared by value; an argument of another type rules graphs out.
template <class T> void graph_key_of(GraphRequest& req, const T& arg, std::size_t argnum) {
  const std::size_t type = typeid(T).hash_code();
  add_key_bytes(req.key, &type, sizeof(type));
  if constexpr (TreeArgument<T>) {
    tree_for_each_with_path(arg, [&](const std::string& path, const auto& leaf) {
      using L = std::remove_cvref_t<decltype(leaf)>;
      if constexpr (!std::is_same_v<L, Array>) {
        add_key_string(req.key, path);
        const std::size_t leaf_type = typeid(L).hash_code();
        add_key_bytes(req.key, &leaf_type, sizeof(leaf_type));
        add_key_bytes(req.key, &leaf, sizeof(L));
      }
    });
  } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
    add_key_bytes(req.key, &arg, sizeof(T));
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    add_key_string(req.key, std::string_view(arg));
  } else {
    if (req.why_not.empty())
      req.why_not = "argument " + std::to_string(argnum) +
                    " is neither a tree nor a bool, number, enum or string: a graph launch could not tell a "
                    "new value of it";
  }
  req.key += ';';
}

template <class T> void input_leaves(std::vector<const Array*>& out, const T& arg) {
  if constexpr (TreeArgument<T>) tree_for_each(arg, [&](const auto& leaf) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(leaf)>, Array>) out.push_back(&leaf);
  });
}

// An argument as the capture sees it: a tree's Array leaves at their staged places, a static one as it is.
template <class T> using Staged = std::conditional_t<TreeArgument<T>, T, const T&>;
template <class T> Staged<T> staged_argument(const T& arg, const Call& call, std::size_t& next) {
  if constexpr (TreeArgument<T>) {
    return tree_map(arg, [&](const auto& leaf) {
      using L = std::remove_cvref_t<decltype(leaf)>;
      if constexpr (std::is_same_v<L, Array>) {
        return call.staged(next++);
      } else {
        return leaf;
      }
    });
  } else {
    return arg;
  }
}

template <class R> R empty_leaves(const R& result) {
  return tree_map(result, [](const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<L, Array>) {
      return Array();
    } else {
      return leaf;
    }
  });
}

template <class R> R from_template(const R& tmpl, std::vector<Array>& leaves) {
  std::size_t next = 0;
  return tree_map(tmpl, [&](const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<L, Array>) {
      return std::move(leaves[next++]);
    } else {
      return leaf;
    }
  });
}

}  // namespace jit_detail

template <class F> class Jitted {
 public:
  Jitted(F f, std::string name, JitOptions options = {})
      : f_(std::move(f)), state_(jit_detail::make_state(std::move(name))), options_(options) {}

  // f(args...) through the signature's plan (see above).
  template <class... Args> auto operator()(const Args&... args) const {
    using R = std::remove_cvref_t<decltype(f_(args...))>;
    if (jit_detail::inside_transformation()) {
      jit_detail::count_unplanned(*state_);
      return R(f_(args...));
    }
    std::string signature;
    std::size_t argnum = 0;
    (jit_detail::signature_of(signature, args, argnum++), ...);
    jit_detail::GraphRequest graph;
    graph.wanted = options_.graphs;
    if (graph.wanted) {
      graph.result_type = &typeid(R);
      std::size_t keynum = 0;
      (jit_detail::graph_key_of(graph, args, keynum++), ...);
      (jit_detail::input_leaves(graph.inputs, args), ...);
    }
    jit_detail::Call call(*state_, std::move(signature), graph.wanted ? &graph : nullptr);
    if (!call.planned()) return R(f_(args...));
    if (call.launching()) {
      std::vector<Array> leaves = call.launch();
      return jit_detail::from_template(*static_cast<const R*>(call.result_template()), leaves);
    }
    if (call.capturing()) {
      std::size_t next = 0;
      std::tuple<jit_detail::Staged<Args>...> staged{jit_detail::staged_argument(args, call, next)...};
      const auto make_template = [](void* r) -> std::shared_ptr<void> {
        return std::make_shared<R>(jit_detail::empty_leaves(*static_cast<R*>(r)));
      };
      if (call.capture([&] {
            R r = std::apply([&](const auto&... a) { return R(f_(a...)); }, staged);
            call.captured_results(jit_detail::result_leaves(r), &r);
          }, make_template)) {
        std::vector<Array> leaves = call.launch();
        return jit_detail::from_template(*static_cast<const R*>(call.result_template()), leaves);
      }
    }
    R result = f_(args...);
    call.finish(jit_detail::result_leaves(result));
    return result;
  }

  JitStats stats() const { return jit_detail::stats_of(*state_); }
  const std::string& name() const { return jit_detail::name_of(*state_); }

 private:
  F f_;
  std::shared_ptr<jit_detail::State> state_;
  JitOptions options_;
};

// jit(f, name): f traced once per signature and replayed on its buffer plan; `name` names f in errors.
template <class F> Jitted<F> jit(F f, std::string name = "the function", JitOptions options = {}) {
  return Jitted<F>(std::move(f), std::move(name), options);
}

}  // namespace pmap
