// The stand-in CUDA runtime (see pmapcc_standin.h and README.md): fake GPUs, device memory, streams as host
// threads, events, graph capture and replay, with CUDA's errors for what CUDA refuses.
#include "pmapcc_standin.h"
#include "standin_internal.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pmapcc_standin {

struct Capture;

// Waits, yielding and then sleeping, until ready(). No lock: the only order it gives is the acquire loads
// inside ready(), so that a wait orders exactly what CUDA's does.
// The i-th wait of a poll: yield at first, then sleep a little longer.
inline void back_off(int i) {
  if (i < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(i < 512 ? 20 : 200));
  }
}

template <class F> void poll(F ready) {
  for (int i = 0; !ready(); ++i) back_off(i);
}

}  // namespace pmapcc_standin

// The handles of cuda_runtime_api.h are pointers to these (incomplete in the header).
struct CUevent_st {
  int device = 0;
  std::mutex record_mutex;                   // callers only
  std::uint64_t recorded = 0;                // records issued (under record_mutex)
  std::atomic<std::uint64_t> completed{0};   // the latest record its stream has reached (release)
  pmapcc_standin::Capture* capture = nullptr;  // recorded into this capture: a fork/join point (record_mutex)
  CUstream_st* captured_by = nullptr;

  std::uint64_t generation() {
    std::lock_guard lock(record_mutex);
    return recorded;
  }
  void reach(std::uint64_t generation) {  // on the recording stream's executor
    std::uint64_t current = completed.load(std::memory_order_relaxed);
    while (current < generation && !completed.compare_exchange_weak(current, generation, std::memory_order_release,
                                                                     std::memory_order_relaxed)) {
    }
  }
  bool reached(std::uint64_t generation) const { return completed.load(std::memory_order_acquire) >= generation; }
};

struct CUgraph_st {
  int device = 0;
  std::shared_ptr<std::vector<std::function<void()>>> nodes;
};

struct CUgraphExec_st {
  int device = 0;
  std::shared_ptr<const std::vector<std::function<void()>>> nodes;
};

namespace pmapcc_standin {

struct Capture {
  CUstream_st* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  std::mutex mutex;  // callers only: the fields below
  std::shared_ptr<std::vector<std::function<void()>>> nodes = std::make_shared<std::vector<std::function<void()>>>();
  bool invalidated = false;
  std::set<CUstream_st*> unjoined;  // streams forked into the capture and not yet joined back

  void invalidate() {
    std::lock_guard lock(mutex);
    invalidated = true;
  }
  bool is_invalidated() {
    std::lock_guard lock(mutex);
    return invalidated;
  }
};

}  // namespace pmapcc_standin

// A stream: one host thread running its work in order, asynchronously from its callers. Executors and
// callers share no lock: work reaches the executor through an atomic list (release by the caller, acquire
// by the executor) and completion reaches callers through an atomic counter (release by the executor,
// acquire by a synchronizing call), so the only happens-before edges are the ones CUDA gives. A lock
// between them would order work that CUDA does not order, and ThreadSanitizer would miss the race.
struct CUstream_st {
  struct Node {
    std::function<void()> op;
    Node* next = nullptr;
  };
  int device = 0;
  unsigned flags = 0;
  bool legacy = false;
  std::mutex submit_mutex;               // callers only: tickets in the order of the list
  std::uint64_t submitted = 0;           // under submit_mutex
  std::atomic<Node*> head{nullptr};      // pushed by callers, taken whole by the executor (newest first)
  std::atomic<std::uint64_t> completed{0};
  std::atomic<bool> stopping{false};
  pmapcc_standin::Capture* capture = nullptr;  // guarded by the registry lock

  void run() {
    std::uint64_t done = 0;
    for (int idle = 0;; ++idle) {
      Node* list = head.exchange(nullptr, std::memory_order_acquire);
      if (list == nullptr) {
        if (stopping.load(std::memory_order_acquire) && head.load(std::memory_order_acquire) == nullptr) break;
        pmapcc_standin::back_off(idle);
        continue;
      }
      idle = 0;
      Node* fifo = nullptr;
      while (list != nullptr) {  // reverse into submission order
        Node* next = list->next;
        list->next = fifo;
        fifo = list;
        list = next;
      }
      while (fifo != nullptr) {
        Node* next = fifo->next;
        fifo->op();
        delete fifo;
        fifo = next;
        completed.store(++done, std::memory_order_release);
      }
    }
    delete this;  // destroyed streams release themselves once their work is done
  }
  std::uint64_t enqueue(std::function<void()> op) {
    std::lock_guard lock(submit_mutex);
    auto* node = new Node{std::move(op), head.load(std::memory_order_relaxed)};
    while (!head.compare_exchange_weak(node->next, node, std::memory_order_release, std::memory_order_relaxed)) {
    }
    return ++submitted;
  }
  std::uint64_t ticket() {
    std::lock_guard lock(submit_mutex);
    return submitted;
  }
  void wait_for(std::uint64_t ticket) {
    pmapcc_standin::poll([&] { return completed.load(std::memory_order_acquire) >= ticket; });
  }
  void drain() { wait_for(ticket()); }
  bool idle() { return completed.load(std::memory_order_acquire) >= ticket(); }
};

namespace pmapcc_standin {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kQuarantineBytes = std::size_t{1} << 30;  // then the oldest freed ranges are unmapped
constexpr std::size_t kQuarantineRanges = 8192;

struct Allocation {
  std::size_t bytes = 0;   // as requested
  std::size_t mapped = 0;  // page-rounded
  int device = 0;
};

struct Fault {
  int error = 0;
  int times = 0;
  int skip = 0;
};

// Everything shared. Callers take the lock (shared for lookups); executors never do.
struct Registry {
  std::shared_mutex mutex;
  int gpus = 0;
  std::vector<CUstream_st*> legacy;                  // per device
  std::set<CUstream_st*> streams;                    // live created streams
  std::map<CUevent_st*, std::shared_ptr<CUevent_st>> events;  // queued work holds its own reference
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> execs;
  std::map<std::uintptr_t, Allocation> device_memory;  // base -> allocation
  std::map<std::uintptr_t, std::size_t> pinned;        // base -> bytes
  std::deque<std::pair<void*, std::size_t>> quarantine;
  std::size_t quarantine_bytes = 0;
  std::atomic<std::uint64_t> kernel_launches{0}, graph_launches{0};  // run, not recorded into a capture
  std::vector<std::vector<bool>> peer;               // peer[a][b]: a may access b
  std::set<Capture*> captures;
  std::mutex fault_mutex;
  std::map<std::string, Fault> faults;
};

// The environment variable `name` as a number from lo to hi (`fallback` when unset or empty); anything else
// exits 2 naming the variable and saying what it must be.
int number_from_environment(const char* name, int fallback, long lo, long hi, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    std::fprintf(stderr, "pmapcc CUDA stand-in: %s must be %s from %ld to %ld, got '%s'\n", name, what, lo, hi, v);
    std::exit(2);
  }
  return static_cast<int>(n);
}

int gpus_from_environment() {
  return number_from_environment("PMAPCC_STANDIN_GPUS", 1, 0, 64, "a number of fake GPUs");
}

}  // namespace

int node() {
  static const int n = number_from_environment("PMAPCC_STANDIN_NODE", -1, 0, 255, "a node number");
  return n;
}

namespace {

void parse_faults(Registry& r) {
  const char* v = std::getenv("PMAPCC_STANDIN_FAIL");
  if (v == nullptr) return;
  std::string spec(v);
  std::size_t pos = 0;
  while (pos < spec.size()) {
    std::size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    const std::size_t eq = item.find('=');
    Fault f{0, 1, 0};
    if (eq == std::string::npos || eq == 0 ||
        std::sscanf(item.c_str() + eq + 1, "%d", &f.error) != 1) {
      std::fprintf(stderr, "pmapcc CUDA stand-in: PMAPCC_STANDIN_FAIL: '%s' is not api=error[@skip][xtimes]\n",
                   item.c_str());
      std::exit(2);
    }
    if (const std::size_t at = item.find('@', eq); at != std::string::npos) f.skip = std::atoi(item.c_str() + at + 1);
    if (const std::size_t x = item.find('x', eq); x != std::string::npos) f.times = std::atoi(item.c_str() + x + 1);
    r.faults[item.substr(0, eq)] = f;
  }
}

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: executors may outlive static destruction
    reg->gpus = gpus_from_environment();
    (void)node();  // a bad PMAPCC_STANDIN_NODE is refused at once, like a bad PMAPCC_STANDIN_GPUS
    reg->peer.assign(static_cast<std::size_t>(reg->gpus), std::vector<bool>(static_cast<std::size_t>(reg->gpus)));
    for (int d = 0; d < reg->gpus; ++d) {
      auto* s = new CUstream_st;
      s->device = d;
      s->legacy = true;
      reg->legacy.push_back(s);
      std::thread(&CUstream_st::run, s).detach();
    }
    parse_faults(*reg);
    return reg;
  }();
  return *r;
}

struct ThreadState {
  int device = 0;
  cudaError_t last = cudaSuccess;
};
thread_local ThreadState tls;

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) tls.last = e;
  return e;
}

bool valid_device(const Registry& r, int d) { return d >= 0 && d < r.gpus; }

// Resolves a stream handle (nullptr: the current device's legacy stream). Registry lock held by the caller.
CUstream_st* resolve(Registry& r, cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy)
    return valid_device(r, tls.device) ? r.legacy[static_cast<std::size_t>(tls.device)] : nullptr;
  if (s == cudaStreamPerThread) return nullptr;  // not modelled: pmapcc never uses it
  return r.streams.count(s) != 0 ? s : nullptr;
}

// CUDA's rules for calls that are unsafe during a capture: in global mode, from any thread; in
// thread-local mode, from the capturing thread. Such a call invalidates those captures and fails.
cudaError_t capture_unsafe(Registry& r, cudaError_t error = cudaErrorStreamCaptureUnsupported) {
  bool hit = false;
  for (Capture* c : r.captures) {
    const bool applies = c->mode == cudaStreamCaptureModeGlobal ||
                         (c->mode == cudaStreamCaptureModeThreadLocal && c->thread == std::this_thread::get_id());
    if (applies) {
      c->invalidate();
      hit = true;
    }
  }
  return hit ? error : cudaSuccess;
}

// A stream whose work would be recorded: a capture in progress on it.
Capture* capturing(CUstream_st* s) { return s->capture; }

// The legacy stream synchronizes with the device's blocking streams: work queued on it waits for their
// earlier work, and their later work waits for it.
void legacy_ordering(Registry& r, CUstream_st* s) {
  auto wait_on = [](CUstream_st* waiter, CUstream_st* target) {
    const std::uint64_t ticket = target->ticket();
    if (ticket > 0) waiter->enqueue([target, ticket] { target->wait_for(ticket); });
  };
  if (s->legacy) {
    for (CUstream_st* other : r.streams)
      if (other->device == s->device && (other->flags & cudaStreamNonBlocking) == 0) wait_on(s, other);
  } else if ((s->flags & cudaStreamNonBlocking) == 0) {
    wait_on(s, r.legacy[static_cast<std::size_t>(s->device)]);
  }
}

// Work on the legacy stream of device d waits for the device's blocking streams, so it would join a capture
// that one of them is in: CUDA fails such work and invalidates that capture, in every capture mode. A
// capture on non-blocking streams only is left alone (seen on an H200, CUDA 13.0, 2026-11-27).
cudaError_t legacy_capture_conflict(Registry& r, int d) {
  bool hit = false;
  for (CUstream_st* other : r.streams) {
    if (other->device != d || other->capture == nullptr || (other->flags & cudaStreamNonBlocking) != 0) continue;
    other->capture->invalidate();
    hit = true;
  }
  return hit ? cudaErrorStreamCaptureImplicit : cudaSuccess;
}

// Queues op on s, or records it into s's capture. Registry lock held (shared suffices).
cudaError_t submit(Registry& r, CUstream_st* s, std::function<void()> op) {
  if (Capture* c = capturing(s)) {
    std::lock_guard lock(c->mutex);
    if (c->invalidated) return cudaErrorStreamCaptureInvalidated;
    c->nodes->push_back(std::move(op));
    return cudaSuccess;
  }
  if (s->legacy) {
    if (cudaError_t e = legacy_capture_conflict(r, s->device); e != cudaSuccess) return e;
  }
  legacy_ordering(r, s);
  s->enqueue(std::move(op));
  return cudaSuccess;
}

// Waits for every stream of device d (callers: the implicit synchronizations of free and friends).
void drain_device(Registry& r, int d) {
  r.legacy[static_cast<std::size_t>(d)]->drain();
  for (CUstream_st* s : r.streams)
    if (s->device == d) s->drain();
}

enum class Kind { device, pinned, pageable };

struct Pointer {
  Kind kind = Kind::pageable;
  int device = -1;
  std::size_t room = 0;  // bytes from the pointer to the end of its allocation (device and pinned)
};

Pointer classify(const Registry& r, const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (auto it = r.device_memory.upper_bound(a); it != r.device_memory.begin()) {
    --it;
    if (a >= it->first && a < it->first + std::max<std::size_t>(it->second.bytes, 1))
      return Pointer{Kind::device, it->second.device, it->first + it->second.bytes - a};
  }
  if (auto it = r.pinned.upper_bound(a); it != r.pinned.begin()) {
    --it;
    if (a >= it->first && a < it->first + it->second) return Pointer{Kind::pinned, -1, it->first + it->second - a};
  }
  return Pointer{};
}

// A copy's pointers against its kind, and each side's span against its allocation.
cudaError_t check_copy(const Registry& r, void* dst, std::size_t dspan, const void* src, std::size_t sspan,
                       cudaMemcpyKind kind, Pointer& d, Pointer& s) {
  d = classify(r, dst);
  s = classify(r, src);
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if ((d.kind != Kind::pageable && d.room < dspan) || (s.kind != Kind::pageable && s.room < sspan))
    return cudaErrorInvalidValue;  // runs past the end of its allocation
  const bool d_dev = d.kind == Kind::device, s_dev = s.kind == Kind::device;
  switch (kind) {
    case cudaMemcpyHostToHost: return !d_dev && !s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToDevice: return d_dev && !s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return !d_dev && s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return d_dev && s_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

// An asynchronous copy of `rows` rows on stream s, CUDA's way with pageable host memory: the source is
// staged at the call (so the caller may reuse it), a pageable destination makes the call wait. Under a
// capture, a copy from or to pageable memory is recorded like any other (seen on an H200, CUDA 13.0,
// 2026-11-27, host to device): the graph reads and writes the host memory when it runs.
cudaError_t copy_async(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                       std::size_t rows, cudaMemcpyKind kind, cudaStream_t stream, const char* api) {
  if (cudaError_t e = injected(api); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::uint64_t ticket = 0;
  CUstream_st* s = nullptr;
  {
    std::shared_lock lock(r.mutex);
    s = resolve(r, stream);
    if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
    if (width == 0 || rows == 0) return cudaSuccess;
    if (dpitch < width || spitch < width) return fail(cudaErrorInvalidPitchValue);
    const std::size_t dspan = dpitch * (rows - 1) + width, sspan = spitch * (rows - 1) + width;
    Pointer d, sp;
    if (cudaError_t e = check_copy(r, dst, dspan, src, sspan, kind, d, sp); e != cudaSuccess) return fail(e);
    const bool recorded = capturing(s) != nullptr;
    std::function<void()> op;
    if (sp.kind == Kind::pageable && !recorded) {  // staged now
      auto staged = std::make_shared<std::vector<unsigned char>>(sspan);
      std::memcpy(staged->data(), src, sspan);
      op = [dst, dpitch, staged, spitch, width, rows] {
        for (std::size_t i = 0; i < rows; ++i)
          std::memcpy(static_cast<char*>(dst) + i * dpitch, staged->data() + i * spitch, width);
      };
    } else {
      op = [dst, dpitch, src, spitch, width, rows] {
        for (std::size_t i = 0; i < rows; ++i)
          std::memcpy(static_cast<char*>(dst) + i * dpitch, static_cast<const char*>(src) + i * spitch, width);
      };
    }
    if (cudaError_t e = submit(r, s, std::move(op)); e != cudaSuccess) return fail(e);
    if (d.kind != Kind::pageable || recorded) return cudaSuccess;
    ticket = s->ticket();
  }
  s->wait_for(ticket);  // into pageable memory: returns when the copy is done
  return cudaSuccess;
}

cudaError_t memset_async(void* p, int value, std::size_t bytes, cudaStream_t stream, const char* api) {
  if (cudaError_t e = injected(api); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  const Pointer ptr = classify(r, p);
  if (ptr.kind != Kind::device || ptr.room < bytes) return fail(cudaErrorInvalidValue);
  return fail(submit(r, s, [p, value, bytes] { std::memset(p, value, bytes); }));
}

cudaError_t synchronize_stream(cudaStream_t stream, const char* api) {
  if (cudaError_t e = injected(api); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  CUstream_st* s = nullptr;
  {
    std::shared_lock lock(r.mutex);
    s = resolve(r, stream);
    if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
    if (Capture* c = capturing(s)) {
      c->invalidate();
      return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
  }
  s->drain();
  return cudaSuccess;
}

}  // namespace

// ---- shared with cublas.cpp (standin_internal.h) ----

cudaError_t injected(const char* api) {
  Registry& r = registry();
  std::lock_guard lock(r.fault_mutex);
  auto it = r.faults.find(api);
  if (it == r.faults.end()) return cudaSuccess;
  Fault& f = it->second;
  if (f.skip > 0) {
    --f.skip;
    return cudaSuccess;
  }
  const int error = f.error;
  if (--f.times <= 0) r.faults.erase(it);
  return static_cast<cudaError_t>(error);
}

int current_device() { return tls.device; }

StreamInfo stream_info(cudaStream_t stream) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr) return StreamInfo{};
  return StreamInfo{true, s->device, s->capture != nullptr};
}

int pointer_device(const void* p, std::size_t bytes) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  const Pointer ptr = classify(r, p);
  if (ptr.kind != Kind::device || ptr.room < bytes) return -1;
  return ptr.device;
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> op, int device) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  const bool legacy = stream == nullptr || stream == cudaStreamLegacy;
  CUstream_st* s = !legacy || device < 0 ? resolve(r, stream)
                   : valid_device(r, device) ? r.legacy[static_cast<std::size_t>(device)]
                                             : nullptr;
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  return submit(r, s, std::move(op));
}

// ---- pmapcc_standin.h ----

cudaError_t launch(cudaStream_t stream, std::function<void()> body) {
  if (cudaError_t e = injected("cudaLaunchKernel"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  if (!valid_device(r, tls.device)) return fail(cudaErrorNoDevice);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr || s->device != tls.device) return fail(cudaErrorInvalidResourceHandle);
  const bool recorded = capturing(s) != nullptr;
  const cudaError_t e = submit(r, s, std::move(body));
  if (e == cudaSuccess && !recorded) ++r.kernel_launches;
  return fail(e);
}

void inject_fault(const char* api, int error, int times, int skip) {
  Registry& r = registry();
  std::lock_guard lock(r.fault_mutex);
  r.faults[api] = Fault{error, times, skip};
}

void clear_faults() {
  Registry& r = registry();
  std::lock_guard lock(r.fault_mutex);
  r.faults.clear();
}

std::uint64_t kernel_launches() { return registry().kernel_launches; }
std::uint64_t graph_launches() { return registry().graph_launches; }

std::size_t quarantined_bytes() {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  return r.quarantine_bytes;
}

}  // namespace pmapcc_standin

using namespace pmapcc_standin;  // NOLINT: the C API below is CUDA's

// ---- errors ----

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = tls.last;
  tls.last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return tls.last; }

}  // extern "C"

namespace {

struct ErrorText {
  cudaError_t error;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capture sequence contains a fork that was not joined to the primary stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* find_error(cudaError_t e) {
  for (const ErrorText& t : kErrors)
    if (t.error == e) return &t;
  return nullptr;
}

}  // namespace

extern "C" {

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* t = find_error(error);
  return t != nullptr ? t->name : "cudaErrorUnknown (not modelled by the stand-in)";
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* t = find_error(error);
  return t != nullptr ? t->text : "an error the CUDA stand-in does not name";
}

// ---- devices ----

cudaError_t cudaGetDeviceCount(int* count) {
  if (cudaError_t e = injected("cudaGetDeviceCount"); e != cudaSuccess) return fail(e);
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = registry().gpus;
  return *count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (cudaError_t e = injected("cudaSetDevice"); e != cudaSuccess) return fail(e);
  if (!valid_device(registry(), device)) return fail(cudaErrorInvalidDevice);
  tls.device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (cudaError_t e = injected("cudaGetDevice"); e != cudaSuccess) return fail(e);
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (registry().gpus == 0) return fail(cudaErrorNoDevice);
  *device = tls.device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (cudaError_t e = injected("cudaGetDeviceProperties"); e != cudaSuccess) return fail(e);
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (!valid_device(registry(), device)) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "pmapcc CUDA stand-in GPU %d", device);
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = std::size_t{80} << 30;
  prop->multiProcessorCount = 132;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  const char tag[] = "pmapccstandin";
  for (std::size_t i = 0; i + 1 < sizeof prop->uuid.bytes; ++i) prop->uuid.bytes[i] = i < sizeof tag - 1 ? tag[i] : '-';
  prop->uuid.bytes[sizeof prop->uuid.bytes - 1] = static_cast<char>(device);
  if (node() >= 0) prop->uuid.bytes[sizeof prop->uuid.bytes - 2] = static_cast<char>(node());  // another machine's
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  Registry& r = registry();
  if (can == nullptr) return fail(cudaErrorInvalidValue);
  if (!valid_device(r, device) || !valid_device(r, peer)) return fail(cudaErrorInvalidDevice);
  *can = device != peer ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  if (cudaError_t e = injected("cudaDeviceEnablePeerAccess"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (!valid_device(r, peer) || peer == tls.device) return fail(cudaErrorInvalidDevice);
  auto row = r.peer[static_cast<std::size_t>(tls.device)][static_cast<std::size_t>(peer)];
  if (row) return fail(cudaErrorPeerAccessAlreadyEnabled);
  r.peer[static_cast<std::size_t>(tls.device)][static_cast<std::size_t>(peer)] = true;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (cudaError_t e = injected("cudaDeviceSynchronize"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  {
    std::shared_lock lock(r.mutex);
    if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
    drain_device(r, tls.device);
  }
  return cudaSuccess;
}

// ---- memory ----

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (cudaError_t e = injected("cudaMalloc"); e != cudaSuccess) return fail(e);
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (!valid_device(r, tls.device)) return fail(cudaErrorNoDevice);
  if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  const std::size_t mapped = (bytes + kPage - 1) / kPage * kPage;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  // Fresh device memory holds garbage on a GPU: never zeros a test could come to rely on.
  std::memset(p, 0xA5, bytes);
  r.device_memory[reinterpret_cast<std::uintptr_t>(p)] = Allocation{bytes, mapped, tls.device};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (cudaError_t e = injected("cudaFree"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  {
    // cudaFree synchronizes the device: work in flight that uses the memory finishes first (under the
    // shared lock, so that other threads' calls go on meanwhile).
    std::shared_lock lock(r.mutex);
    if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
    if (ptr == nullptr) return cudaSuccess;
    auto it = r.device_memory.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == r.device_memory.end()) return fail(cudaErrorInvalidValue);
    drain_device(r, it->second.device);
  }
  std::unique_lock lock(r.mutex);
  auto it = r.device_memory.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == r.device_memory.end()) return fail(cudaErrorInvalidValue);  // freed twice at once
  const Allocation a = it->second;
  r.device_memory.erase(it);
  // Quarantine: the range stays mapped with no access, so a kernel, copy or graph that still uses it faults.
  mprotect(ptr, a.mapped, PROT_NONE);
  r.quarantine.emplace_back(ptr, a.mapped);
  r.quarantine_bytes += a.mapped;
  while (r.quarantine_bytes > kQuarantineBytes || r.quarantine.size() > kQuarantineRanges) {
    munmap(r.quarantine.front().first, r.quarantine.front().second);
    r.quarantine_bytes -= r.quarantine.front().second;
    r.quarantine.pop_front();
  }
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  if (cudaError_t e = injected("cudaHostAlloc"); e != cudaSuccess) return fail(e);
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  (void)flags;
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
  void* p = std::aligned_alloc(kPage, (std::max<std::size_t>(bytes, 1) + kPage - 1) / kPage * kPage);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  r.pinned[reinterpret_cast<std::uintptr_t>(p)] = std::max<std::size_t>(bytes, 1);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  if (cudaError_t e = injected("cudaFreeHost"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  {
    std::shared_lock lock(r.mutex);
    if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
    if (ptr == nullptr) return cudaSuccess;
    if (r.pinned.count(reinterpret_cast<std::uintptr_t>(ptr)) == 0) return fail(cudaErrorInvalidValue);
    for (int d = 0; d < r.gpus; ++d) drain_device(r, d);  // as CUDA's, an implicit synchronization
  }
  std::unique_lock lock(r.mutex);
  auto it = r.pinned.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == r.pinned.end()) return fail(cudaErrorInvalidValue);
  r.pinned.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  return memset_async(ptr, value, bytes, stream, "cudaMemsetAsync");
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  if (cudaError_t e = memset_async(ptr, value, bytes, nullptr, "cudaMemset"); e != cudaSuccess) return e;
  return synchronize_stream(nullptr, "cudaMemset");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  return copy_async(dst, bytes, src, bytes, bytes, 1, kind, stream, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (cudaError_t e = copy_async(dst, bytes, src, bytes, bytes, 1, kind, nullptr, "cudaMemcpy"); e != cudaSuccess)
    return e;
  return synchronize_stream(nullptr, "cudaMemcpy");
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  return copy_async(dst, dpitch, src, spitch, width, height, kind, stream, "cudaMemcpy2DAsync");
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                                cudaStream_t stream) {
  {
    Registry& r = registry();
    std::shared_lock lock(r.mutex);
    if (!valid_device(r, dst_device) || !valid_device(r, src_device)) return fail(cudaErrorInvalidDevice);
    const Pointer d = classify(r, dst), s = classify(r, src);
    if (bytes > 0 && (d.kind != Kind::device || d.device != dst_device || s.kind != Kind::device ||
                      s.device != src_device))
      return fail(cudaErrorInvalidValue);  // each pointer must be memory of the GPU named beside it
  }
  return copy_async(dst, bytes, src, bytes, bytes, 1, cudaMemcpyDeviceToDevice, stream, "cudaMemcpyPeerAsync");
}

// ---- streams ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (cudaError_t e = injected("cudaStreamCreateWithFlags"); e != cudaSuccess) return fail(e);
  if (stream == nullptr || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0)
    return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (!valid_device(r, tls.device)) return fail(cudaErrorNoDevice);
  auto* s = new CUstream_st;
  s->device = tls.device;
  s->flags = flags;
  r.streams.insert(s);
  std::thread(&CUstream_st::run, s).detach();
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (cudaError_t e = injected("cudaStreamDestroy"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (stream == nullptr || r.streams.count(stream) == 0) return fail(cudaErrorInvalidResourceHandle);
  if (stream->capture != nullptr) return fail(cudaErrorStreamCaptureUnsupported);
  r.streams.erase(stream);
  // As CUDA's: returns at once; the stream finishes its work, then releases itself.
  stream->stopping.store(true, std::memory_order_release);
  return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  if (cudaError_t e = injected("cudaStreamGetDevice"); e != cudaSuccess) return fail(e);
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  *device = s->device;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return synchronize_stream(stream, "cudaStreamSynchronize"); }

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t e = injected("cudaStreamQuery"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (Capture* c = capturing(s)) {
    c->invalidate();
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
  return s->idle() ? cudaSuccess : cudaErrorNotReady;  // not an error: the last error is left alone
}

// ---- events ----

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (cudaError_t e = injected("cudaEventCreateWithFlags"); e != cudaSuccess) return fail(e);
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  (void)flags;
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  auto ev = std::make_shared<CUevent_st>();
  ev->device = tls.device;
  r.events.emplace(ev.get(), ev);
  *event = ev.get();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  // Work still queued holds the event: as CUDA's, its resources go when that work is done.
  if (event == nullptr || r.events.erase(event) == 0) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t e = injected("cudaEventRecord"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  CUstream_st* s = resolve(r, stream);
  auto found = r.events.find(event);
  if (s == nullptr || found == r.events.end()) return fail(cudaErrorInvalidResourceHandle);
  if (event->device != s->device) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<CUevent_st> held = found->second;
  if (Capture* c = capturing(s)) {  // a capture's fork/join point
    if (c->is_invalidated()) return fail(cudaErrorStreamCaptureInvalidated);
    std::lock_guard e(event->record_mutex);
    event->capture = c;
    event->captured_by = s;
    return cudaSuccess;
  }
  std::uint64_t generation = 0;
  {
    std::lock_guard e(event->record_mutex);
    event->capture = nullptr;
    generation = ++event->recorded;
  }
  return fail(submit(r, s, [held, generation] { held->reach(generation); }));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (cudaError_t e = injected("cudaStreamWaitEvent"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::unique_lock lock(r.mutex);  // may change a stream's capture
  CUstream_st* s = resolve(r, stream);
  auto found = r.events.find(event);
  if (s == nullptr || found == r.events.end() || flags != 0) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<CUevent_st> held = found->second;
  Capture* c = nullptr;
  CUstream_st* recorder = nullptr;
  std::uint64_t generation = 0;
  {
    std::lock_guard e(event->record_mutex);
    c = event->capture;
    recorder = event->captured_by;
    generation = event->recorded;
  }
  if (c != nullptr && r.captures.count(c) != 0) {
    std::lock_guard cl(c->mutex);
    if (s->capture == nullptr) {  // fork: s joins the capture
      s->capture = c;
      if (s != c->origin) c->unjoined.insert(s);
    } else if (s == c->origin) {  // join back
      c->unjoined.erase(recorder);
    }
    return cudaSuccess;
  }
  if (generation == 0) return cudaSuccess;  // never recorded: nothing to wait for
  return fail(submit(r, s, [held, generation] { poll([&] { return held->reached(generation); }); }));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (cudaError_t e = injected("cudaEventSynchronize"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::uint64_t generation = 0;
  std::shared_ptr<CUevent_st> held;
  {
    std::shared_lock lock(r.mutex);
    auto found = r.events.find(event);
    if (found == r.events.end()) return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
    held = found->second;
    generation = held->generation();
  }
  poll([&] { return held->reached(generation); });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  auto found = r.events.find(event);
  if (found == r.events.end()) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = capture_unsafe(r); e != cudaSuccess) return fail(e);
  return found->second->reached(found->second->generation()) ? cudaSuccess : cudaErrorNotReady;
}

// ---- graphs ----

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (cudaError_t e = injected("cudaStreamBeginCapture"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (stream == nullptr || stream == cudaStreamLegacy) return fail(cudaErrorStreamCaptureUnsupported);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture != nullptr) return fail(cudaErrorIllegalState);
  auto* c = new Capture;
  c->origin = s;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  s->capture = c;
  r.captures.insert(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (cudaError_t e = injected("cudaStreamEndCapture"); e != cudaSuccess) return fail(e);
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  Capture* c = s->capture;
  if (c == nullptr || c->origin != s) return fail(cudaErrorIllegalState);
  // Another thread may not end a non-relaxed capture, but its call ends it all the same, graphless: with
  // cudaErrorStreamCaptureWrongThread when the capture was valid, cudaErrorStreamCaptureInvalidated when it
  // was not (both seen on an H200, CUDA 13.0, 2026-11-27, in global mode).
  const bool wrong_thread =
      c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id() && !c->is_invalidated();
  bool unjoined = false;
  {
    std::lock_guard cl(c->mutex);
    unjoined = !c->unjoined.empty();
  }
  for (CUstream_st* other : r.streams)
    if (other->capture == c) other->capture = nullptr;
  s->capture = nullptr;
  for (auto& [handle, ev] : r.events) {
    std::lock_guard e(ev->record_mutex);
    if (ev->capture == c) ev->capture = nullptr;
  }
  r.captures.erase(c);
  std::unique_ptr<Capture> owned(c);
  *graph = nullptr;
  if (wrong_thread) return fail(cudaErrorStreamCaptureWrongThread);
  if (unjoined) return fail(cudaErrorStreamCaptureUnjoined);
  if (c->is_invalidated()) return fail(cudaErrorStreamCaptureInvalidated);
  auto* g = new CUgraph_st;
  g->device = s->device;
  g->nodes = c->nodes;
  r.graphs.insert(g);
  *graph = g;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (cudaError_t e = injected("cudaStreamIsCapturing"); e != cudaSuccess) return fail(e);
  if (status == nullptr) return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  *status = s->capture == nullptr     ? cudaStreamCaptureStatusNone
            : s->capture->is_invalidated() ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  if (cudaError_t e = injected("cudaGraphInstantiate"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (exec == nullptr || graph == nullptr || r.graphs.count(graph) == 0 || flags != 0)
    return fail(cudaErrorInvalidValue);
  auto* x = new CUgraphExec_st;
  x->device = graph->device;
  x->nodes = std::make_shared<const std::vector<std::function<void()>>>(*graph->nodes);
  r.execs.insert(x);
  *exec = x;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (graph == nullptr || r.graphs.erase(graph) == 0) return fail(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (cudaError_t e = injected("cudaGraphLaunch"); e != cudaSuccess) return fail(e);
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  CUstream_st* s = resolve(r, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (exec == nullptr || r.execs.count(exec) == 0) return fail(cudaErrorInvalidValue);
  if (exec->device != s->device) return fail(cudaErrorInvalidValue);  // a graph runs on its own GPU's streams
  std::shared_ptr<const std::vector<std::function<void()>>> nodes = exec->nodes;
  const bool recorded = capturing(s) != nullptr;
  const cudaError_t e = submit(r, s, [nodes] {
    for (const auto& node : *nodes) node();
  });
  if (e == cudaSuccess && !recorded) ++r.graph_launches;
  return fail(e);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (exec == nullptr || r.execs.erase(exec) == 0) return fail(cudaErrorInvalidValue);
  delete exec;  // queued replays hold the nodes themselves
  return cudaSuccess;
}

}  // extern "C"
