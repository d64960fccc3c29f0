// Graph capture guard: while the calling thread captures a step into a graph (a CUDA graph on its stream,
// or the recording of a host run of the CUDA kernels), what a replay could not repeat or would break is
// refused with a CaptureError that names the operation: allocating memory, a blocking copy or any other
// synchronization with the host, and collectives (they meet the other devices on the host). Internal to
// pmapcc; the runtime's Arrays and collectives and the kernels' scratch memory check it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pmap {
class Communicator;
struct CollectiveOp;
}

namespace pmap::detail {

// Marks the calling thread as capturing for the scope (nests; `what` names the capture in messages).
class CaptureScope {
 public:
  explicit CaptureScope(const char* what);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

  // Throws the CaptureError of the first thing noted (note_capture_violation) during this scope, if any:
  // what cannot raise where it happens (a destructor) is raised here, after the captured body.
  void check() const;

 private:
  struct Deferred {
    void (*free)(int ordinal, void* ptr) noexcept;
    int ordinal;
    void* ptr;
  };
  friend void note_capture_violation(const std::string& op, const char* does) noexcept;
  friend bool free_after_capture(void (*free)(int, void*) noexcept, int ordinal, void* ptr) noexcept;
  const char* what_;
  const char* previous_;
  CaptureScope* outer_;
  bool violated_ = false;  // something was noted (its message, when it could be built, in violation_)
  std::string violation_;
  std::vector<Deferred> deferred_;  // memory freed during the scope: released when the outermost scope ends
};

// The name of the capture the calling thread is inside, or nullptr. Never throws.
const char* capturing() noexcept;

// Throws CaptureError "<op> <does> during <capture>: ..." when the calling thread is capturing.
// `does` says what is not allowed, e.g. "allocates device memory", "synchronizes with the host". Hot
// paths test capturing() first, so that they build the message only when it is needed.
void check_not_capturing(const std::string& op, const char* does);

// The same for code that cannot throw (an Array freed inside the capture, whose memory the graph may still
// use at a replay): notes the error in the innermost CaptureScope, whose check() raises it. Never throws.
void note_capture_violation(const std::string& op, const char* does) noexcept;

// Memory freed inside a capture cannot be released there: a CUDA capture refuses cudaFree and
// cudaFreeHost, and is invalidated by them, so the memory would leak. This keeps `free(ordinal, ptr)` for
// the end of the outermost CaptureScope (which a CUDA capture outlives its cudaStreamEndCapture for).
// Returns false when the calling thread is not capturing, or the call cannot be kept (out of memory): the
// caller frees at once then. Never throws.
bool free_after_capture(void (*free)(int ordinal, void* ptr) noexcept, int ordinal, void* ptr) noexcept;

// Collectives inside a capture. A capturer whose graph's launches meet the peers (Communicator::graph_meet
// and graph_wait; jit) holds a CollectiveLog on the capturing thread: a collective over a communicator that
// captures() is then recorded into the graph and logged here, instead of refused. Without one (a StepGraph,
// a user's own capture), collectives stay refused.
class CollectiveLog {
 public:
  struct Use {
    Communicator* comm;
    std::size_t ops;          // recorded collectives over comm
    std::uint64_t signature;  // a hash of their signatures (kind, reduce, dtype, count, root, permutation)
  };
  CollectiveLog();
  ~CollectiveLog();
  CollectiveLog(const CollectiveLog&) = delete;
  CollectiveLog& operator=(const CollectiveLog&) = delete;
  // The calling thread's innermost log, or nullptr.
  static CollectiveLog* current() noexcept;
  // A collective over `comm` recorded into the capture (the communicator's run() calls it).
  void note(Communicator* comm, const CollectiveOp& op);
  // The communicator with peers (size() > 1) the log has noted, or nullptr: one graph records the
  // collectives of one such communicator at most (a failure in one could not be unblocked in the other).
  Communicator* with_peers() const noexcept;
  // Each communicator once, in the order of first use.
  const std::vector<Use>& uses() const { return uses_; }

 private:
  CollectiveLog* previous_;
  std::vector<Use> uses_;
};

// A graph holding collectives of communicators: NCCL's destroy and abort wait until every such graph is
// destroyed, so a communicator drops the graphs registered with it before either (drop_graphs). drop() must
// destroy the graph and be safe to call from any thread, once the graph's launches have returned.
class HeldGraph {
 public:
  virtual ~HeldGraph() = default;
  virtual void drop() noexcept = 0;
};
// Registers `graph` with `comm` (weakly: a graph destroyed by its owner is forgotten), for a communicator
// whose holds_graphs() is true (NCCL's), which calls drop_graphs before its abort and destruction.
void hold_graph(const Communicator* comm, const std::weak_ptr<HeldGraph>& graph);
// Drops every graph registered with `comm` that still exists (the communicator's abort and destruction).
void drop_graphs(const Communicator* comm) noexcept;

}  // namespace pmap::detail
