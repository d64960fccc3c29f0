// jit's buffer plans: the trace records each Array allocation (size, device) and when it is freed; the plan
// places them in one arena per device, best fit, a place reused once its buffer is dead; a replay hands the
// same places out in the same order, checking each against the buffers still alive.
#include <pmapcc/core/jit.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>

#include <pmap/detail/allocation.h>
#include <pmap/error.h>

#include <pmapcc/core/batching.h>
#include <pmapcc/core/trace.h>

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
  bool result = false;  // one of the function's results: the heap's, handed to the caller
};

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
  }
  std::mutex mutex;
  std::vector<Block> blocks;  // in allocation order
  std::vector<Arena> arenas;
  std::vector<Array> retired;  // arenas a value that escaped a replay still points into
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

  // Places every block; returns the arenas' sizes (by device, in order of first use).
  std::vector<std::pair<Device, std::size_t>> place() {
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
      if (b.result) continue;
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
    if (b.result) {
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
  std::lock_guard lock(state.mutex);
  s.signatures = state.entries.size();
  return s;
}

bool inside_transformation() noexcept {
  return core::Trace::active() != nullptr || core::BatchLevel::active() != nullptr;
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

struct Call::Impl {
  std::unique_lock<std::mutex> lock;
  bool replay = false;
  bool finished = false;
  bool retrace = false;
  std::unique_ptr<Recorder> recorder;
  std::unique_ptr<Replayer> replayer;
  detail::AllocationHook* hook = nullptr;
  detail::AllocationHook* previous = nullptr;
  bool installed = false;
  std::uint64_t allocations_at_start = 0;

  void install() {
    previous = detail::set_allocation_hook(hook);
    installed = true;
  }
  void uninstall() noexcept {
    if (installed) detail::set_allocation_hook(previous);
    installed = false;
  }
};

Call::Call(State& state, std::string signature) : state_(state) {
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
  entry_ = entry;
  if (entry->planned && !entry->stale) {
    impl->replay = true;
    ++state.replays;
    impl->replayer = std::make_unique<Replayer>(*entry);
    impl->hook = impl->replayer.get();
  } else {
    impl->retrace = entry->planned || entry->stale;
    ++state.traces;
    if (impl->retrace) ++state.retraces;
    drop_arenas(state, *entry, false);
    entry->blocks.clear();
    impl->recorder = std::make_unique<Recorder>(entry->blocks);
    impl->hook = impl->recorder.get();
  }
  impl_ = std::move(impl);
  impl_->allocations_at_start = detail::allocation_count();
  impl_->install();
}

Call::~Call() {
  if (impl_ == nullptr) return;
  impl_->uninstall();
  if (!impl_->finished && entry_ != nullptr) {  // the function threw: trace again next time
    auto* entry = static_cast<Entry*>(entry_);
    if (impl_->replay) {
      if (impl_->replayer->alive() != 0) drop_arenas(state_, *entry, true);  // (an escaped value keeps its place)
      entry->stale = true;
    } else {
      entry->blocks.clear();
    }
  }
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
      copy = leaf->copy();
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
  HookScope no_hook(nullptr);
  for (const auto& [device, bytes] : rec.place()) {
    Arena a;
    a.device = device;
    a.bytes = bytes;
    a.storage = Array::uninitialized(Shape{static_cast<std::int64_t>(bytes / sizeof(float))}, DType::f32, device);
    if (bytes > 0) poison(device, a.base(), bytes);
    entry->arenas.push_back(std::move(a));
    state_.arena_bytes += bytes;
  }
  entry->planned = true;
  entry->stale = false;
}

}  // namespace pmap::jit_detail
