// jit's buffer plans: the trace records each Array allocation (size, device) and when it is freed; the plan
// places them in one arena per device, best fit, a place reused once its buffer is dead; a replay hands the
// same places out in the same order, checking each against the buffers still alive.
#include <pmapcc/core/jit.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>

#include <pmap/communicator.h>
#include <pmap/detail/allocation.h>
#include <pmap/detail/capture.h>
#include <pmap/error.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/trace.h>
#include <pmapcc/kernels/eager/array_ops.h>
#include <pmapcc/kernels/backend.h>
#include <pmapcc/kernels/graph.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PMAPCC_JIT_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define PMAPCC_JIT_ASAN 1
#endif
#ifdef PMAPCC_JIT_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace pmap::jit_detail {
namespace {

// Under AddressSanitizer a host arena's places are poisoned while no Array holds them, and a held place is
// open for its Array's bytes only (rounded to 64, as a host Array's own block): a replay's use after free
// or overflow is reported as the heap's would be.
void mark(const Device& d, void* p, std::size_t n, bool poisoned) {
#ifdef PMAPCC_JIT_ASAN
  if (!d.is_cpu() || p == nullptr) return;
  if (poisoned) {
    ASAN_POISON_MEMORY_REGION(p, n);
  } else {
    ASAN_UNPOISON_MEMORY_REGION(p, n);
  }
#else
  (void)d, (void)p, (void)n, (void)poisoned;
#endif
}
void poison(const Device& d, void* p, std::size_t n) { mark(d, p, n, true); }
void unpoison(const Device& d, void* p, std::size_t n) { mark(d, p, n, false); }

constexpr std::size_t kPlanAlign = 256;  // every place starts on 256 bytes (cudaMalloc's alignment)
std::size_t planned_bytes(std::size_t bytes) { return (bytes + kPlanAlign - 1) / kPlanAlign * kPlanAlign; }

struct Block {
  std::size_t bytes = 0;  // planned_bytes of the Array's
  Device device;
  std::size_t arena = 0;
  std::size_t offset = 0;
  bool placed = false;  // false: the trace never allocated it (an allocation that failed), or a result
  bool result = false;  // one of the function's results: the heap's, handed to the caller (placed too
                        // in a graph's plan, and copied out)
};

// A result leaf of a captured graph: where the graph leaves it.
struct ResultPlace {
  bool valid = false;
  const void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

// A graph holding collectives (NCCL's): its communicators drop it (detail::drop_graphs) before NCCL tears
// them down, from whichever thread aborts or destroys them; a launch holds the lock while it queues the graph.
struct SharedGraph final : detail::HeldGraph {
  std::mutex mutex;
  std::unique_ptr<kernels::Graph> graph;
  void drop() noexcept override {
    std::lock_guard lock(mutex);
    graph.reset();
  }
  bool alive() {
    std::lock_guard lock(mutex);
    return graph != nullptr;
  }
};

// The graph of a signature, once captured.
struct GraphPlan {
  bool planned = false;  // the plan places the results too (one device, a backend that captures)
  const kernels::Backend* backend = nullptr;
  Device device;
  std::unique_ptr<kernels::Graph> graph;  // a graph without collectives
  std::shared_ptr<SharedGraph> shared;    // ... or with them, over these communicators (launches meet the peers)
  std::vector<detail::CollectiveLog::Use> collectives;
  std::string key;             // the static arguments and scalar leaves it was captured with
  std::uint64_t thread = 0;    // the capturing thread's token
  std::uint64_t warm = 0;      // the thread that last ran the function (its handles and scratch exist),
  std::string warm_key;        // with these static arguments, scalar leaves and precision
  const std::type_info* result_type = nullptr;
  std::vector<Array> stage;    // one place per argument leaf (an empty Array for an empty leaf)
  std::vector<ResultPlace> results;
  std::shared_ptr<void> result_template;
  bool has_graph() const { return graph != nullptr || (shared != nullptr && shared->alive()); }
  void reset_graph() {
    graph.reset();
    shared.reset();
    collectives.clear();
  }
  void drop() {
    reset_graph();
    stage.clear();
    results.clear();
    result_template.reset();
  }
};

// A token per thread, never reused (a thread id can be): a graph holds the capturing thread's scratch
// memory and cuBLAS workspace, so it is launched on that thread only.
std::uint64_t thread_token() noexcept {
  static std::atomic<std::uint64_t> next{0};
  thread_local const std::uint64_t token = ++next;
  return token;
}

struct Arena {
  Device device;
  std::size_t bytes = 0;
  Array storage;  // the arena itself (f32 elements), allocated once per plan
  char* base() { return static_cast<char*>(storage.raw_data()); }
};

struct Entry {
  Entry() = default;
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() {  // the arenas go back to the heap whole
    for (Arena& a : arenas) {
      if (a.bytes > 0) unpoison(a.device, a.base(), a.bytes);
    }
    for (Array& r : retired) {
      if (r.nbytes() > 0) unpoison(r.device(), r.raw_data(), r.nbytes());
    }
    graph.drop();  // before the arenas it points into
  }
  std::mutex mutex;
  std::vector<Block> blocks;  // in allocation order
  std::vector<Arena> arenas;
  std::vector<Array> retired;  // arenas a value that escaped a replay still points into
  GraphPlan graph;
  bool graph_refused = false;  // a capture was refused: traced again without a graph's plan, for good
  bool planned = false;
  bool stale = false;  // the last replay left its plan: trace again
};

// Places blocks in arenas: best fit among the free places (the lowest on a tie), else at the top.
class Placer {
 public:
  std::size_t place(std::size_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best == free_.end()) {
      const std::size_t offset = top_;
      top_ += bytes;
      high_ = std::max(high_, top_);
      return offset;
    }
    const std::size_t offset = best->first, left = best->second - bytes;
    free_.erase(best);
    if (left > 0) free_.emplace(offset + bytes, left);
    return offset;
  }
  void release(std::size_t offset, std::size_t bytes) {
    auto it = free_.emplace(offset, bytes).first;
    if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
        it = prev;
      }
    }
    if (it->first + it->second == top_) {  // the free place at the top: the top comes down
      top_ = it->first;
      free_.erase(it);
    }
  }
  std::size_t high() const { return high_; }

 private:
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes
  std::size_t top_ = 0, high_ = 0;
};

// The trace's hook: every allocation is the heap's, recorded with when it is freed.
class Recorder final : public detail::AllocationHook {
 public:
  explicit Recorder(std::vector<Block>& blocks) : blocks_(blocks) {}
  void* provide(std::size_t bytes, const Device& device) noexcept override {
    try {
      blocks_.push_back(Block{planned_bytes(bytes), device});
      pending_ = blocks_.size() - 1;
    } catch (...) {
      failed_ = true;
    }
    return nullptr;
  }
  void allocated(void* data, std::size_t) noexcept override {
    try {
      live_.insert_or_assign(data, pending_);  // (an address freed on another thread, unheard, comes back)
      events_.push_back({true, pending_});
    } catch (...) {
      failed_ = true;
    }
  }
  void released(void* data, bool) noexcept override {
    auto it = live_.find(data);
    if (it == live_.end()) return;  // not the function's: an argument, a value from before
    try {
      events_.push_back({false, it->second});
    } catch (...) {
      failed_ = true;
    }
    live_.erase(it);
  }
  // A result of the function: left to the heap by the plan. False when it is not the function's own.
  bool mark_result(void* data) {
    auto it = live_.find(data);
    if (it == live_.end()) return false;
    blocks_[it->second].result = true;
    live_.erase(it);
    return true;
  }
  std::size_t alive() const { return live_.size(); }
  bool failed() const { return failed_; }
  // The devices of the blocks allocated.
  std::vector<Device> devices() const {
    std::vector<Device> out;
    for (const Block& b : blocks_) {
      if (std::find(out.begin(), out.end(), b.device) == out.end()) out.push_back(b.device);
    }
    return out;
  }

  // Places every block; returns the arenas' sizes (by device, in order of first use).
  std::vector<std::pair<Device, std::size_t>> place(bool keep_results) {
    std::vector<std::pair<Device, Placer>> placers;
    auto placer_of = [&](const Device& d) -> std::size_t {
      for (std::size_t i = 0; i < placers.size(); ++i) {
        if (placers[i].first == d) return i;
      }
      placers.emplace_back(d, Placer{});
      return placers.size() - 1;
    };
    for (const auto& [alloc, k] : events_) {
      Block& b = blocks_[k];
      if (b.result && !keep_results) continue;
      if (alloc) {
        b.arena = placer_of(b.device);
        b.offset = placers[b.arena].second.place(b.bytes);
        b.placed = true;
      } else {
        placers[b.arena].second.release(b.offset, b.bytes);
      }
    }
    std::vector<std::pair<Device, std::size_t>> sizes;
    for (const auto& [d, p] : placers) sizes.emplace_back(d, p.high());
    return sizes;
  }

 private:
  std::vector<Block>& blocks_;
  std::size_t pending_ = 0;
  std::unordered_map<void*, std::size_t> live_;
  std::vector<std::pair<bool, std::size_t>> events_;  // (allocated, block) in order
  bool failed_ = false;
};

// A replay's hook: the k-th allocation gets block k's place when it is the same size on the same device and
// no buffer alive overlaps it; otherwise the heap's memory, and the replay has left its plan.
class Replayer final : public detail::AllocationHook {
 public:
  explicit Replayer(Entry& entry) : entry_(entry) {}
  void* provide(std::size_t bytes, const Device& device) noexcept override {
    if (next_ >= entry_.blocks.size()) {
      diverged_ = true;
      return nullptr;
    }
    const Block& b = entry_.blocks[next_++];
    if (b.bytes != planned_bytes(bytes) || !(b.device == device) || (!b.placed && !b.result)) {
      diverged_ = true;
      return nullptr;
    }
    if (b.result && !b.placed) {
      ++results_;
      return nullptr;
    }
    char* start = entry_.arenas[b.arena].base() + b.offset;
    char* end = start + b.bytes;
    auto it = live_.lower_bound(end);  // the first alive buffer at or after the end
    if (it != live_.begin() && std::prev(it)->second > start) {
      diverged_ = true;  // a buffer the plan takes as dead is alive: leave it alone
      return nullptr;
    }
    try {
      live_.emplace(start, end);
    } catch (...) {
      diverged_ = true;
      return nullptr;
    }
    unpoison(device, start, (bytes + 63) / 64 * 64);  // as much as a host Array's own block (64-byte rounded)
    return start;
  }
  void allocated(void*, std::size_t) noexcept override {}
  void released(void* data, bool provided) noexcept override {
    if (!provided) return;
    auto it = live_.find(static_cast<char*>(data));
    if (it == live_.end()) return;  // another jit's place
    if (it->first != it->second) {
      // (which arena: the one whose range holds it; poisoning is only for host memory, so any CPU arena)
      for (Arena& a : entry_.arenas) {
        if (a.bytes > 0 && it->first >= a.base() && it->first < a.base() + a.bytes) {
          poison(a.device, it->first, static_cast<std::size_t>(it->second - it->first));
          break;
        }
      }
    }
    live_.erase(it);
  }
  bool diverged() const { return diverged_ || next_ != entry_.blocks.size(); }
  bool diverged_early() const { return diverged_; }  // an allocation so far left the plan
  std::size_t alive() const { return live_.size(); }
  std::uint64_t results() const { return results_; }  // allocations the plan left to the heap as results

 private:
  Entry& entry_;
  std::size_t next_ = 0;
  std::uint64_t results_ = 0;
  bool diverged_ = false;
  std::map<char*, char*> live_;  // start -> end of the places handed out and not yet freed
};

}  // namespace

struct State {
  explicit State(std::string n) : name(std::move(n)) {}
  std::string name;
  mutable std::mutex mutex;
  std::map<std::string, std::unique_ptr<Entry>> entries;
  std::atomic<std::uint64_t> traces{0}, retraces{0}, replays{0}, diverged{0}, unplanned{0};
  std::atomic<std::uint64_t> last_allocations{0}, last_result_allocations{0};
  std::atomic<std::size_t> arena_bytes{0};
  std::atomic<std::uint64_t> graph_captures{0}, graph_launches{0}, graph_refusals{0};
  std::string graph_refusal;  // (mutex)
};

namespace {

// `hook` (nullptr: none) as the calling thread's allocation hook for the scope. With none, an arena is the
// jit's own memory, never part of an enclosing jitted function's plan (a jit called inside another).
class HookScope {
 public:
  explicit HookScope(detail::AllocationHook* hook) : previous_(detail::set_allocation_hook(hook)) {}
  ~HookScope() { detail::set_allocation_hook(previous_); }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;

 private:
  detail::AllocationHook* previous_;
};

// Gives up an entry's arenas; retire: a value that escaped still points into them, so they are kept (for
// as long as the jitted function lives).
void drop_arenas(State& state, Entry& entry, bool retire) {
  HookScope no_hook(nullptr);
  entry.graph.drop();  // a graph points into the arenas and holds the staged arguments
  entry.graph.planned = false;
  for (Arena& a : entry.arenas) {
    state.arena_bytes -= a.bytes;
    if (!retire && a.bytes > 0) unpoison(a.device, a.base(), a.bytes);  // (a retired arena keeps its marks)
    if (retire) entry.retired.push_back(std::move(a.storage));
  }
  entry.arenas.clear();
  entry.planned = false;
}

}  // namespace

std::shared_ptr<State> make_state(std::string name) { return std::make_shared<State>(std::move(name)); }
const std::string& name_of(const State& state) { return state.name; }
void count_unplanned(State& state) noexcept { ++state.unplanned; }

JitStats stats_of(const State& state) {
  JitStats s;
  s.traces = state.traces;
  s.retraces = state.retraces;
  s.replays = state.replays;
  s.diverged = state.diverged;
  s.unplanned = state.unplanned;
  s.last_allocations = state.last_allocations;
  s.last_result_allocations = state.last_result_allocations;
  s.arena_bytes = state.arena_bytes;
  s.graph_captures = state.graph_captures;
  s.graph_launches = state.graph_launches;
  s.graph_refusals = state.graph_refusals;
  std::lock_guard lock(state.mutex);
  s.signatures = state.entries.size();
  s.graph_refusal = state.graph_refusal;
  return s;
}

bool inside_transformation() noexcept {
  return core::Trace::active() != nullptr || core::BatchLevel::active() != nullptr;
}

void add_key_bytes(std::string& out, const void* data, std::size_t n) {
  out.append(static_cast<const char*>(data), n);
}

void add_key_string(std::string& out, std::string_view s) {
  const std::size_t n = s.size();
  add_key_bytes(out, &n, sizeof(n));
  out.append(s);
}

void add_signature(std::string& out, const std::string& where, const Array& a) {
  out += where;
  out += ':';
  if (!a.valid()) {
    out += "empty,";
    return;
  }
  out += a.signature();
  out += '@';
  out += a.device().str();
  out += ',';
}

enum class Mode { trace, replay, capture, launch };

struct Call::Impl {
  std::unique_lock<std::mutex> lock;
  Mode mode = Mode::trace;
  bool replay = false;  // replay, capture or launch: the entry's plan is used
  bool finished = false;
  bool retrace = false;
  bool staged = false;  // the arguments are at their places for this call
  GraphRequest* request = nullptr;
  std::unique_ptr<Recorder> recorder;
  std::unique_ptr<Replayer> replayer;
  detail::AllocationHook* hook = nullptr;
  detail::AllocationHook* previous = nullptr;
  bool installed = false;
  std::uint64_t allocations_at_start = 0;
  std::shared_ptr<void> (*make_template)(void*) = nullptr;

  void install() {
    previous = detail::set_allocation_hook(hook);
    installed = true;
  }
  void uninstall() noexcept {
    if (installed) detail::set_allocation_hook(previous);
    installed = false;
  }
};

namespace {

// The backend computing on `device` on this thread, or nullptr (a CUDA device outside its pmap).
const kernels::Backend* backend_here(const Device& device) noexcept {
  try {
    return &ops::detail::backend_of("jit", device);
  } catch (...) {
    return nullptr;
  }
}

void note_refusal(State& state, const std::string& why) {
  ++state.graph_refusals;
  std::lock_guard lock(state.mutex);
  state.graph_refusal = "jit of '" + state.name + "': " + why;
}

// Copies the call's argument leaves to their places (made the first time).
void stage_inputs(GraphPlan& g, const GraphRequest& request) {
  HookScope own(nullptr);  // the places are the jit's own memory, outside any plan
  if (g.stage.size() != request.inputs.size()) {
    g.stage.clear();
    for (const Array* a : request.inputs) {
      g.stage.push_back(a->valid() ? Array::uninitialized(a->shape(), a->dtype(), a->device()) : Array());
    }
  }
  for (std::size_t i = 0; i < request.inputs.size(); ++i) {
    const Array& a = *request.inputs[i];
    if (a.valid() && a.nbytes() > 0) g.backend->copy(g.stage[i].raw_data(), a.raw_data(), a.nbytes());
  }
}

}  // namespace

Call::Call(State& state, std::string signature, GraphRequest* graph) : state_(state) {
  Entry* entry = nullptr;
  {
    std::lock_guard lock(state.mutex);
    auto& slot = state.entries[std::move(signature)];
    if (!slot) slot = std::make_unique<Entry>();
    entry = slot.get();
  }
  auto impl = std::make_unique<Impl>();
  impl->lock = std::unique_lock(entry->mutex, std::try_to_lock);
  if (!impl->lock.owns_lock()) {  // the same signature running already (recursion): run it as it is
    ++state.unplanned;
    return;
  }
  // Inside another jitted function's capture: that graph would keep pointing into this plan's arenas,
  // which a retrace of this one frees. Refused (the outer function replays without a graph).
  if (detail::capturing() != nullptr) {
    throw CaptureError("jit of '" + state.name + "' called inside the capture of another jitted function (its " +
                       "plan's memory is its own)");
  }
  entry_ = entry;
  impl->request = graph;
  if (graph != nullptr) {  // the thread's default precision is read at the capture as an argument would be
    graph->key += static_cast<char>(ops::eager::default_precision());
  }
  if (entry->planned && !entry->stale) {
    impl->replay = true;
    impl->mode = Mode::replay;
    ++state.replays;
    GraphPlan& g = entry->graph;
    if (graph != nullptr && g.planned && graph->why_not.empty() && backend_here(g.device) == g.backend) {
      const std::uint64_t here = thread_token();
      const bool same = g.has_graph() && g.key == graph->key && g.thread == here &&
                        g.result_type != nullptr && *g.result_type == *graph->result_type;
      if (same) {
        impl->mode = Mode::launch;
      } else if (g.warm == here && g.warm_key == graph->key) {
        impl->mode = Mode::capture;
        g.reset_graph();
        stage_inputs(g, *graph);
        impl->staged = true;
      } else {
        // A thread's first call with these static values runs as a replay: it makes the handles and scratch
        // a capture cannot (they allocate), and the next such call captures. (A value that changes on every
        // call so never captures, where capturing every time would be slower than no graph.)
        g.warm = here;
        g.warm_key = graph->key;
      }
    }
    if (impl->mode != Mode::launch) {
      impl->replayer = std::make_unique<Replayer>(*entry);
      impl->hook = impl->replayer.get();
    }
  } else {
    impl->retrace = entry->planned || entry->stale;
    ++state.traces;
    if (impl->retrace) ++state.retraces;
    drop_arenas(state, *entry, false);
    entry->blocks.clear();
    entry->graph = GraphPlan{};
    impl->recorder = std::make_unique<Recorder>(entry->blocks);
    impl->hook = impl->recorder.get();
  }
  impl_ = std::move(impl);
  impl_->allocations_at_start = detail::allocation_count();
  if (impl_->hook != nullptr) impl_->install();
}

Call::~Call() {
  if (impl_ == nullptr) return;
  impl_->uninstall();
  if (!impl_->finished && entry_ != nullptr) {  // the function threw: trace again next time
    auto* entry = static_cast<Entry*>(entry_);
    if (impl_->replay) {
      if (impl_->replayer != nullptr && impl_->replayer->alive() != 0) {
        drop_arenas(state_, *entry, true);  // (an escaped value keeps its place)
      }
      entry->stale = true;
    } else {
      entry->blocks.clear();
    }
  }
}

bool Call::launching() const { return impl_ != nullptr && impl_->mode == Mode::launch; }
bool Call::capturing() const { return impl_ != nullptr && impl_->mode == Mode::capture; }

const void* Call::result_template() const { return static_cast<Entry*>(entry_)->graph.result_template.get(); }

Array Call::staged(std::size_t i) const {
  GraphPlan& g = static_cast<Entry*>(entry_)->graph;
  const Array& a = *impl_->request->inputs.at(i);
  if (!a.valid()) return Array();
  return Array::borrow(g.stage.at(i).raw_data(), a.shape(), a.dtype(), a.device());
}

void Call::captured_results(const std::vector<Array*>& results, void* result) {
  auto* entry = static_cast<Entry*>(entry_);
  GraphPlan& g = entry->graph;
  g.results.clear();
  // A launch copies each result out of where the capture left it: that must be the plan's or an argument's
  // place, which live as long as the graph (not memory of the closure, which may be gone by then).
  const auto owned = [&](const Array& a) {
    const char* p = static_cast<const char*>(a.raw_data());
    for (Arena& ar : entry->arenas) {
      if (ar.bytes > 0 && p >= ar.base() && p + a.nbytes() <= ar.base() + ar.bytes) return true;
    }
    for (const Array& s : g.stage) {
      const char* b = static_cast<const char*>(s.raw_data());
      if (s.valid() && p >= b && p + a.nbytes() <= b + s.nbytes()) return true;
    }
    return false;
  };
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Array& a = *results[i];
    if (a.valid() && a.nbytes() > 0 && !owned(a))
      throw CaptureError("result " + std::to_string(i) + " (" + a.str() +
                         ") is memory the function did not compute in its plan (an Array of its closure?)");
  }
  for (const Array* leaf : results) {
    ResultPlace r;
    if (leaf->valid()) {
      r.valid = true;
      r.data = leaf->raw_data();
      r.shape = leaf->shape();
      r.dtype = leaf->dtype();
      r.device = leaf->device();
    }
    g.results.push_back(std::move(r));
  }
  g.result_template = impl_->make_template(result);
}

bool Call::capture(const std::function<void()>& body, std::shared_ptr<void> (*make_template)(void*)) {
  auto* entry = static_cast<Entry*>(entry_);
  GraphPlan& g = entry->graph;
  Impl& in = *impl_;
  in.make_template = make_template;
  // Back to a plain replay of this call: a fresh replayer (the capture's allocations were all freed).
  const auto plain = [&] {
    g.reset_graph();
    g.results.clear();
    g.result_template.reset();
    in.uninstall();
    in.replayer = std::make_unique<Replayer>(*entry);
    in.hook = in.replayer.get();
    in.mode = Mode::replay;
    in.install();
  };
  std::unique_ptr<kernels::Graph> graph;
  const auto refuse = [&](const std::string& why) {
    const bool diverged = in.replayer->diverged_early();
    plain();
    // Trace again next time: after an allocation off the plan (the capture refuses the heap), or without
    // the graph's plan for good (the results left to the heap, not copied out of it on every call).
    entry->stale = true;
    if (!diverged) {
      entry->graph_refused = true;
      note_refusal(state_, why);
    }
  };
  // NCCL's collectives are recorded too, the launches meeting the peers (Communicator::graph_meet).
  detail::CollectiveLog log;
  try {
    graph = g.backend->capture(body);
  } catch (const CudaError& e) {  // CUDA ended or could not instantiate the capture: a plain replay follows
    refuse(e.what());             // (which raises the error again if it is the function's own)
    return false;
  } catch (const CaptureError& e) {
    refuse(e.what());
    return false;
  } catch (const CollectiveMismatch& e) {
    // Another device ran a collective this one recorded (its capture refused, or its code differs): NCCL
    // needs every device to record a collective or none, so this call fails, and the function replays
    // without a graph from now on, as the refusing device's does (all of them agree again next call).
    entry->graph_refused = true;
    note_refusal(state_, e.what());
    throw;
  }
  if (in.replayer->alive() != 0) {
    const std::size_t n = in.replayer->alive();
    in.uninstall();
    drop_arenas(state_, *entry, true);
    entry->stale = true;
    in.finished = true;
    throw ValueError("jit of '" + state_.name + "': " + std::to_string(n) +
                     " array(s) computed inside the function outlived the call (kept by a reference or a "
                     "global?); a replay would overwrite them: return them as results instead");
  }
  if (in.replayer->diverged()) {  // fewer allocations than the plan: keep no graph, trace again next time
    entry->stale = true;  // (counted as diverged by the plain replay's finish)
    plain();
    return false;
  }
  in.uninstall();
  for (Arena& a : entry->arenas) {  // the graph writes every place at each launch
    if (a.bytes > 0) unpoison(a.device, a.base(), a.bytes);
  }
  if (log.uses().empty()) {
    g.graph = std::move(graph);
  } else {
    // Graphs are launched on the capturing thread only (g.thread), a worker of the mesh whose communicators
    // these are: they live as long as it does. NCCL's drop the graph before they are torn down.
    g.collectives = log.uses();
    auto shared = std::make_shared<SharedGraph>();
    shared->graph = std::move(graph);
    for (const auto& use : g.collectives)
      if (use.comm->holds_graphs()) detail::hold_graph(use.comm, shared);
    g.shared = std::move(shared);
  }
  g.key = in.request->key;
  g.thread = thread_token();
  g.result_type = in.request->result_type;
  ++state_.graph_captures;
  in.mode = Mode::launch;
  return true;
}

std::vector<Array> Call::launch() {
  auto* entry = static_cast<Entry*>(entry_);
  GraphPlan& g = entry->graph;
  Impl& in = *impl_;
  if (!in.staged) stage_inputs(g, *in.request);
  for (Arena& a : entry->arenas) {  // (a plain replay since the capture may have marked places free)
    if (a.bytes > 0) unpoison(a.device, a.base(), a.bytes);
  }
  if (g.shared == nullptr) {
    g.graph->launch();
  } else {
    // Collective, as NCCL requires of a graph holding its operations: every rank meets the others first
    // (one of them doing something else raises instead of hanging on the device), and waits after.
    try {
      for (const auto& use : g.collectives) use.comm->graph_meet(use.ops, use.signature);
    } catch (const CollectiveMismatch& e) {  // another device runs without this graph: see capture()
      entry->graph_refused = true;
      note_refusal(state_, e.what());
      throw;
    }
    {
      std::lock_guard lock(g.shared->mutex);
      if (g.shared->graph == nullptr)
        throw Aborted("jit of '" + state_.name + "': its graph was dropped by its communicators (aborted or "
                      "destroyed) before this launch");
      g.shared->graph->launch();
    }
    for (const auto& use : g.collectives) use.comm->graph_wait();  // (one with peers at most: target())
  }
  std::vector<Array> out;
  out.reserve(g.results.size());
  std::uint64_t result_allocations = 0;
  for (const ResultPlace& r : g.results) {
    if (!r.valid) {
      out.emplace_back();
      continue;
    }
    Array a = Array::uninitialized(r.shape, r.dtype, r.device);
    if (a.nbytes() > 0) {
      g.backend->copy(a.raw_data(), r.data, a.nbytes());
      ++result_allocations;
    }
    out.push_back(std::move(a));
  }
  const std::uint64_t total = detail::allocation_count() - in.allocations_at_start;
  state_.last_result_allocations = result_allocations;
  state_.last_allocations = total - std::min(total, result_allocations);
  ++state_.graph_launches;
  in.finished = true;
  return out;
}

void Call::finish(const std::vector<Array*>& results) {
  auto* entry = static_cast<Entry*>(entry_);
  Impl& in = *impl_;
  std::uint64_t result_allocations = 0;
  for (Array* leaf : results) {
    if (!leaf->valid() || leaf->size() == 0) continue;
    if (!in.replay && leaf->owns_data() && in.recorder->mark_result(leaf->raw_data())) {
      ++result_allocations;
      continue;
    }
    if (in.replay && leaf->owns_data() && !detail::is_provided(*leaf)) continue;  // the heap's already
    // A view, or a place in the arena (a replay that left its plan): copied out, outside the plan; the
    // original is freed under the hook, which hears of it.
    Array copy;
    {
      HookScope outside(in.previous);
      copy = ops::eager::copy(*leaf);  // (queued: inside an outer capture too)
    }
    ++result_allocations;
    *leaf = std::move(copy);
  }
  const std::uint64_t total = detail::allocation_count() - in.allocations_at_start;
  in.uninstall();
  in.finished = true;
  if (in.replay) result_allocations += in.replayer->results();
  state_.last_result_allocations = result_allocations;
  state_.last_allocations = total - result_allocations;
  const auto escaped = [&](std::size_t n) {
    return ValueError("jit of '" + state_.name + "': " + std::to_string(n) +
                      " array(s) computed inside the function outlived the call (kept by a reference or a "
                      "global?); a replay would overwrite them: return them as results instead");
  };
  if (in.replay) {
    if (in.replayer->alive() != 0) {
      drop_arenas(state_, *entry, true);
      entry->stale = true;
      throw escaped(in.replayer->alive());
    }
    if (in.replayer->diverged()) {
      ++state_.diverged;
      entry->stale = true;
    }
    return;
  }
  Recorder& rec = *in.recorder;
  if (rec.alive() != 0) {
    entry->blocks.clear();
    throw escaped(rec.alive());
  }
  if (rec.failed()) {  // out of memory while recording: no plan, trace again next time
    entry->blocks.clear();
    return;
  }
  // A graph's plan: one device whose backend (on this thread) records graphs; the results are placed too.
  GraphPlan& g = entry->graph;
  if (in.request != nullptr && !entry->graph_refused) {
    std::vector<Device> devices = rec.devices();
    for (const Array* a : in.request->inputs) {
      if (a->valid() && std::find(devices.begin(), devices.end(), a->device()) == devices.end())
        devices.push_back(a->device());
    }
    const kernels::Backend* backend = devices.size() == 1 ? backend_here(devices[0]) : nullptr;
    if (backend != nullptr && backend->captures()) {
      if (in.request->why_not.empty()) {
        g.planned = true;
        g.backend = backend;
        g.device = devices[0];
        g.warm = thread_token();
        g.warm_key = in.request->key;
      } else {
        note_refusal(state_, in.request->why_not);
      }
    }
  }
  HookScope no_hook(nullptr);
  if (g.planned) {  // the arguments' places, made with the arenas (a capture allocates nothing)
    for (const Array* a : in.request->inputs)
      g.stage.push_back(a->valid() ? Array::uninitialized(a->shape(), a->dtype(), a->device()) : Array());
  }
  for (const auto& [device, bytes] : rec.place(g.planned)) {
    Arena a;
    a.device = device;
    a.bytes = bytes;
    // The trace's freed blocks wait in the host cache for sizes the replays never ask for again: their pages
    // go back to the kernel first, for the arena to take (on a VM a page the process never had costs far
    // more at its first touch; host_cache.h).
    if (device.is_cpu()) detail::release_cached_host_memory(bytes);
    a.storage = Array::uninitialized(Shape{static_cast<std::int64_t>(bytes / sizeof(float))}, DType::f32, device);
    if (bytes > 0) poison(device, a.base(), bytes);
    entry->arenas.push_back(std::move(a));
    state_.arena_bytes += bytes;
  }
  entry->planned = true;
  entry->stale = false;
}

}  // namespace pmap::jit_detail
