// The thread's graph-capture state and the error raised for what a captured step must not do.
#include <pmap/detail/capture.h>
#include <pmap/error.h>

namespace pmap::detail {
namespace {
thread_local const char* tls_capture = nullptr;
thread_local CaptureScope* tls_scope = nullptr;

std::string capture_message(const std::string& op, const char* does, const char* capture) {
  return op + " " + does + " during " + capture +
         ": a captured step is replayed without its host code, so it must not allocate, free, synchronize "
         "with the host or call collectives (allocate buffers and run collectives outside the captured part)";
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

}  // namespace pmap::detail
