// The thread's graph-capture state and the error raised for what a captured step must not do.
#include <pmap/detail/capture.h>
#include <pmap/error.h>

namespace pmap::detail {
namespace {
thread_local const char* tls_capture = nullptr;
}  // namespace

CaptureScope::CaptureScope(const char* what) : previous_(tls_capture) { tls_capture = what; }
CaptureScope::~CaptureScope() { tls_capture = previous_; }

const char* capturing() noexcept { return tls_capture; }

void check_not_capturing(const std::string& op, const char* does) {
  if (tls_capture == nullptr) return;
  throw CaptureError(op + " " + does + " during " + tls_capture +
                     ": a captured step is replayed without its host code, so it must not allocate, synchronize "
                     "with the host or call collectives (allocate buffers and run collectives outside the "
                     "captured part)");
}

}  // namespace pmap::detail
