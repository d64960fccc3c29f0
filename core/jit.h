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
//   not trees (a bool) are not part of it (the function runs on every call, so a learning rate may change). A new signature traces again (counted in
//   stats().traces); a replay that leaves its plan (the function allocated something the trace did not, in
//   another order or size, or a buffer was still alive where the plan reuses its place) takes the memory
//   from the heap instead, so the result is right, and the next call traces again (stats().retraces):
//   never a silent reuse of live memory.
// - Results are the caller's: the plan leaves them out (they come from the heap, through the host cache on
//   CPU devices, and are handed over without a copy), so a replay allocates exactly its results' arrays.
// - Values computed inside the function must not outlive the call except as results (a buffer kept by a
//   reference would be overwritten by the next replay): one that does raises ValueError naming the function.
// - On the calling thread only: inside pmap, call the jitted function from the per-device function (each
//   device has its own plan); a pmap inside the jitted function runs unplanned on its devices' threads. An
//   Array the function makes must be freed on its thread (one freed elsewhere looks kept: ValueError).
//   A jit called inside another keeps its own plan (its results come from the heap on every call). A value that escaped a replay keeps its arena for as
//   long as the jitted function lives.
//   Inside grad or vmap (a traced argument) the function simply runs, as JAX inlines an inner jit. A
//   jitted function called again while it runs on the same signature (recursion) runs unplanned.
// - Not yet: a replay on a GPU is the function's kernels launched again, not one CUDA graph launch; host
//   code inside still runs on every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
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
class Call {
 public:
  Call(State& state, std::string signature);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  bool planned() const { return entry_ != nullptr; }  // false: run the function as it is
  // The function returned `results` (its Array leaves): they become the caller's (a leaf in the arena or a
  // view is copied out), the hook is removed, and the call is planned (trace) or checked (replay).
  void finish(const std::vector<Array*>& results);

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

}  // namespace jit_detail

template <class F> class Jitted {
 public:
  Jitted(F f, std::string name) : f_(std::move(f)), state_(jit_detail::make_state(std::move(name))) {}

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
    jit_detail::Call call(*state_, std::move(signature));
    if (!call.planned()) return R(f_(args...));
    R result = f_(args...);
    call.finish(jit_detail::result_leaves(result));
    return result;
  }

  JitStats stats() const { return jit_detail::stats_of(*state_); }
  const std::string& name() const { return jit_detail::name_of(*state_); }

 private:
  F f_;
  std::shared_ptr<jit_detail::State> state_;
};

// jit(f, name): f traced once per signature and replayed on its buffer plan; `name` names f in errors.
template <class F> Jitted<F> jit(F f, std::string name = "the function") {
  return Jitted<F>(std::move(f), std::move(name));
}

}  // namespace pmap
