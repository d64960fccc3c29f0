// The thread's graph-capture state and the error raised for what a captured step must not do; the
// collectives a capture recorded, and the graphs that hold communicators.
#include <pmap/detail/capture.h>

#include <algorithm>
#include <map>
#include <mutex>

#include <pmap/collective_op.h>
#include <pmap/communicator.h>
#include <pmap/detail/hash.h>
#include <pmap/error.h>

namespace pmap::detail {
namespace {
thread_local const char* tls_capture = nullptr;
thread_local CaptureScope* tls_scope = nullptr;
thread_local CollectiveLog* tls_log = nullptr;

struct HeldGraphs {
  std::mutex mutex;
  std::multimap<const Communicator*, std::weak_ptr<HeldGraph>> by_comm;
};
HeldGraphs& held_graphs() {
  static auto* h = new HeldGraphs;  // never destroyed: communicators may be torn down at exit
  return *h;
}

std::string capture_message(const std::string& op, const char* does, const char* capture) {
  return op + " " + does + " during " + capture +
         ": a captured step is replayed without its host code, so it must not allocate, free, synchronize "
         "with the host or call collectives other than those jit records (NCCL's, or a one-device group's; "
         "allocate buffers and run the others outside the captured part)";
}
}  // namespace

CaptureScope::CaptureScope(const char* what) : what_(what), previous_(tls_capture), outer_(tls_scope) {
  tls_capture = what;
  tls_scope = this;
}
CaptureScope::~CaptureScope() {
  tls_capture = previous_;
  tls_scope = outer_;
  if (deferred_.empty()) return;
  if (outer_ != nullptr) {
    try {
      outer_->deferred_.insert(outer_->deferred_.end(), deferred_.begin(), deferred_.end());
      return;
    } catch (...) {  // out of memory: released now, inside the outer capture (which then fails)
    }
  }
  for (const Deferred& d : deferred_) d.free(d.ordinal, d.ptr);
}

void CaptureScope::check() const {
  if (!violated_) return;
  throw CaptureError(violation_.empty() ? std::string("an Array was freed during a capture") : violation_);
}

const char* capturing() noexcept { return tls_capture; }

void check_not_capturing(const std::string& op, const char* does) {
  if (tls_capture == nullptr) return;
  throw CaptureError(capture_message(op, does, tls_capture));
}

void note_capture_violation(const std::string& op, const char* does) noexcept {
  CaptureScope* scope = tls_scope;
  if (scope == nullptr || scope->violated_) return;
  scope->violated_ = true;
  try {
    scope->violation_ = capture_message(op, does, scope->what_);
  } catch (...) {  // out of memory for the message: the capture still fails, with check()'s short one
  }
}

bool free_after_capture(void (*free)(int, void*) noexcept, int ordinal, void* ptr) noexcept {
  CaptureScope* scope = tls_scope;
  if (scope == nullptr) return false;
  try {
    scope->deferred_.push_back({free, ordinal, ptr});
  } catch (...) {
    return false;
  }
  return true;
}

CollectiveLog::CollectiveLog() : previous_(tls_log) { tls_log = this; }
CollectiveLog::~CollectiveLog() { tls_log = previous_; }
CollectiveLog* CollectiveLog::current() noexcept { return tls_log; }

void CollectiveLog::note(Communicator* comm, const CollectiveOp& op) {
  auto it = std::find_if(uses_.begin(), uses_.end(), [&](const Use& u) { return u.comm == comm; });
  if (it == uses_.end()) {
    uses_.push_back(Use{comm, 0, kFnvOffsetBasis});
    it = std::prev(uses_.end());
  }
  ++it->ops;
  std::uint64_t h = it->signature;
  for (const std::uint64_t word : {static_cast<std::uint64_t>(op.kind), static_cast<std::uint64_t>(op.reduce),
                                   static_cast<std::uint64_t>(op.dtype), static_cast<std::uint64_t>(op.count),
                                   static_cast<std::uint64_t>(op.root), static_cast<std::uint64_t>(op.perm_id)})
    h = fnv1a_word(h, word);
  it->signature = fnv1a(op.name, h);
}

Communicator* CollectiveLog::with_peers() const noexcept {
  for (const Use& u : uses_)
    if (u.comm->size() > 1) return u.comm;
  return nullptr;
}

void hold_graph(const Communicator* comm, const std::weak_ptr<HeldGraph>& graph) {
  HeldGraphs& h = held_graphs();
  std::lock_guard lock(h.mutex);
  const auto [first, last] = h.by_comm.equal_range(comm);
  for (auto it = first; it != last;) it = it->second.expired() ? h.by_comm.erase(it) : std::next(it);
  h.by_comm.emplace(comm, graph);
}

void drop_graphs(const Communicator* comm) noexcept {
  std::vector<std::shared_ptr<HeldGraph>> graphs;
  {
    HeldGraphs& h = held_graphs();
    std::lock_guard lock(h.mutex);
    const auto [first, last] = h.by_comm.equal_range(comm);
    for (auto it = first; it != last; ++it) {
      if (auto g = it->second.lock()) {
        try {
          graphs.push_back(std::move(g));
        } catch (...) {  // out of memory: dropped here, under the registry's lock (drop() takes only its graph's)
          g->drop();
        }
      }
    }
    h.by_comm.erase(first, last);
  }
  for (const auto& g : graphs) g->drop();  // outside the registry's lock: drop() may wait for a launch
}

}  // namespace pmap::detail
