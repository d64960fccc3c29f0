// Graph capture guard: while the calling thread captures a step into a graph (a CUDA graph on its stream,
// or the recording of a host run of the CUDA kernels), what a replay could not repeat or would break is
// refused with a CaptureError that names the operation: allocating memory, a blocking copy or any other
// synchronization with the host, and collectives (they meet the other devices on the host). Internal to
// pmapcc; the runtime's Arrays and collectives and the kernels' scratch memory check it.
#pragma once

#include <string>
#include <vector>

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

}  // namespace pmap::detail
