// The CPU kernels' helper threads (kernels/cpu/shared/cpu_threads.h, kernels/cpu_backend.h's cpu::threads): each thread
// that calls a CPU op (a pmap CPU device's worker, or any user thread) gets a team of its own, so devices
// never wait on each other's helpers.
#include <pmapcc/kernels/cpu/shared/cpu_threads.h>

#include <pmap/error.h>
#include <pmapcc/kernels/cpu_backend.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace pmap::kernels::cpu {
namespace {

constexpr int kMaxThreads = 64;
// Products below this many multiply-adds stay on the calling thread: about 20 us of work at this
// machine's fp32 rate, several times the cost of waking a parked helper and waiting for it.
constexpr std::int64_t kMinSplitMacs = std::int64_t{1} << 22;

std::atomic<int> g_threads{0};  // 0: not yet read from PMAPCC_CPU_THREADS
std::atomic<std::uint64_t> g_helper_ranges{0};

int parse_threads(const char* text, const std::string& source) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > kMaxThreads)
    throw ValueError(source + ": '" + std::string(text) + "' is not a thread count (expected an integer from 1 to " +
                     std::to_string(kMaxThreads) + ")");
  return static_cast<int>(value);
}

thread_local bool t_in_split = false;   // this thread runs a range of a split: its products are not split again
thread_local bool t_on_helper = false;  // this thread is a helper (a range's packing space is helper_scratch)

// How long a helper (or the caller, for its helpers' ranges) spins before it sleeps: long enough to span
// the gap between the products of one op (an im2col chunk's worth), so a busy device's helpers stay awake.
constexpr auto kSpin = std::chrono::microseconds(200);

// Spins on ready() for up to kSpin; false when it did not become true.
template <class Ready> bool spin(const Ready& ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (ready()) return true;
    if (i % 16 == 0) {
      if (std::chrono::steady_clock::now() >= until) return ready();
      std::this_thread::yield();  // more threads than cores: let the one we wait for run
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

// One calling thread's helpers. run() hands range i (1 <= i < count) to helper i - 1 and runs range 0 itself.
// A job is published as one word, state = generation << 8 | count, so that a helper reads the two together.
class Team {
 public:
  ~Team() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true, std::memory_order_release);
    }
    wake_.notify_all();
    for (std::thread& t : helpers_) t.join();
  }

  void run(int count, const std::function<void(int)>& range) {
    while (static_cast<int>(helpers_.size()) < count - 1) {
      const int index = static_cast<int>(helpers_.size()) + 1;
      helpers_.emplace_back([this, index] { serve(index); });
    }
    range_ = &range;
    error_ = nullptr;
    pending_.store(count - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);  // a helper going to sleep sees the job or is woken
      const std::uint64_t generation = (state_.load(std::memory_order_relaxed) >> 8) + 1;
      state_.store(generation << 8 | static_cast<std::uint64_t>(count), std::memory_order_release);
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      range(0);
    } catch (...) {
      mine = std::current_exception();
    }
    const auto finished = [this] { return pending_.load(std::memory_order_acquire) == 0; };
    if (!spin(finished)) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, finished);
    }
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void serve(int index) {
    t_in_split = t_on_helper = true;
    std::uint64_t seen = 0;  // the state of the last job seen
    for (;;) {
      const auto fresh = [&] {
        return stop_.load(std::memory_order_acquire) || state_.load(std::memory_order_acquire) != seen;
      };
      if (!spin(fresh)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, fresh);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = state_.load(std::memory_order_acquire);
      if (index >= static_cast<int>(seen & 0xff)) continue;  // not in this job
      g_helper_ranges.fetch_add(1, std::memory_order_relaxed);
      try {
        (*range_)(index);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);  // the caller is spinning, or asleep under this mutex
        done_.notify_one();
      }
    }
  }

  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::atomic<std::uint64_t> state_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* range_ = nullptr;  // set before a job is published, read by its helpers
  std::exception_ptr error_;                         // under mutex_ while a job runs
};

thread_local std::unique_ptr<Team> t_team;

struct AlignedFree {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t{64}); }
};
thread_local std::unique_ptr<void, AlignedFree> t_scratch;
thread_local std::size_t t_scratch_bytes = 0;

}  // namespace

int threads() {
  int n = g_threads.load(std::memory_order_acquire);
  if (n > 0) return n;
  const char* env = std::getenv("PMAPCC_CPU_THREADS");
  n = env == nullptr || *env == '\0' ? 1 : parse_threads(env, "PMAPCC_CPU_THREADS");
  int expected = 0;
  g_threads.compare_exchange_strong(expected, n, std::memory_order_acq_rel);
  return g_threads.load(std::memory_order_acquire);
}

void set_threads(int n) {
  if (n < 1 || n > kMaxThreads)
    throw ValueError("set_threads: " + std::to_string(n) + " is not a thread count (expected 1 to " +
                     std::to_string(kMaxThreads) + ")");
  g_threads.store(n, std::memory_order_release);
}

void share_cores(int local_devices, int requested) {
  const char* env = std::getenv("PMAPCC_CPU_THREADS");
  if (requested < 0 && env != nullptr && *env != '\0') return;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cores / std::max(1, local_devices));
  set_threads(requested > 0 ? requested : std::min(share, kMaxThreads));
}

namespace detail {

void split_rows(std::int64_t rows, std::int64_t cols, std::int64_t depth, std::int64_t align,
                const std::function<void(std::int64_t, std::int64_t, bool)>& part) {
  const std::int64_t units = align > 0 ? rows / align : 0;  // whole aligned blocks of rows
  const std::int64_t count = std::min<std::int64_t>(threads(), units);
  if (count < 2 || t_in_split || rows * cols * depth < kMinSplitMacs) {  // a range's own products stay whole
    part(0, rows, t_on_helper);
    return;
  }
  // Range i starts at block i * units / count: sizes differ by at most one block.
  const auto first = [&](std::int64_t i) { return i == count ? rows : i * units / count * align; };
  if (!t_team) t_team = std::make_unique<Team>();
  t_in_split = true;
  try {
    t_team->run(static_cast<int>(count), [&](int i) { part(first(i), first(i + 1) - first(i), i > 0); });
  } catch (...) {
    t_in_split = false;
    throw;
  }
  t_in_split = false;
}

std::uint64_t helper_ranges() noexcept { return g_helper_ranges.load(std::memory_order_relaxed); }

void* helper_scratch(std::size_t bytes) {
  if (bytes > t_scratch_bytes) {
    t_scratch.reset();
    t_scratch_bytes = 0;  // (stays 0 if the allocation throws)
    t_scratch.reset(::operator new(bytes, std::align_val_t{64}));
    t_scratch_bytes = bytes;
  }
  return t_scratch.get();
}

}  // namespace detail
}  // namespace pmap::kernels::cpu
