// WorkerPool: persistent per-device threads (CUDA workers bind their GPU once at start).
#include "workers.h"

#include <algorithm>
#include <chrono>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <pmap/error.h>

#include "cuda_seam.h"

namespace pmap::detail {

namespace {
thread_local std::exception_ptr tls_bind_error;  // the worker's last failure to bind its GPU
}  // namespace

void rethrow_worker_bind_error() {
  if (tls_bind_error) std::rethrow_exception(tls_bind_error);
}
namespace {

thread_local const WorkerPool* tls_pool = nullptr;

void pin_to_core(int index) {
#if defined(__linux__)
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<unsigned>(index) % cores, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
#else
  (void)index;
#endif
}

}  // namespace

WorkerPool::WorkerPool(const std::vector<Device>& devices, bool pin_threads) {
  threads_.reserve(devices.size());
  try {
    for (std::size_t i = 0; i < devices.size(); ++i)
      threads_.emplace_back(&WorkerPool::loop, this, static_cast<int>(i), devices[i], pin_threads);
  } catch (const std::exception& e) {
    const std::size_t started = threads_.size();
    {
      std::lock_guard lk(mu_);
      stop_.store(true);
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw Error("cannot start the worker thread of device " + std::to_string(started) + " of " +
                std::to_string(devices.size()) + " (one thread per device): " + e.what());
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lk(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

bool WorkerPool::on_worker_thread() const { return tls_pool == this; }

template <class P> bool WorkerPool::poll(const P& pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  for (int i = 0;; ++i) {
    if (pred()) return true;
    if ((i & 15) == 15 && std::chrono::steady_clock::now() >= until) return pred();
    std::this_thread::yield();
  }
}

void WorkerPool::run_all(TaskRef task) {
  task_ = &task;
  remaining_.store(static_cast<int>(threads_.size()), std::memory_order_relaxed);
  {
    // Under mu_, so a worker that found no new task and went to sleep is woken (see loop).
    std::lock_guard lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);
    if (sleepers_ > 0) start_cv_.notify_all();
  }
  auto done = [&] { return remaining_.load(std::memory_order_acquire) == 0; };
  if (!poll(done)) {
    std::unique_lock lk(mu_);
    caller_asleep_ = true;
    done_cv_.wait(lk, done);
    caller_asleep_ = false;
  }
  task_ = nullptr;
}

void WorkerPool::loop(int index, Device device, bool pin) {
  tls_pool = this;
  if (pin && device.is_cpu()) pin_to_core(index);
  bool bound = device.is_cpu();
  std::uint64_t seen = 0;
  auto started = [&] {
    return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    if (!poll(started)) {
      std::unique_lock lk(mu_);
      ++sleepers_;
      start_cv_.wait(lk, started);
      --sleepers_;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    if (!bound) {  // tried before every task until it succeeds; the task raises the failure
      try {
        cuda_bind_thread(device.ordinal);
        bound = true;
        tls_bind_error = nullptr;
      } catch (...) {
        tls_bind_error = std::current_exception();
      }
    }
    (*task_)(index);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The last one: wake run_all if it went to sleep. Under mu_, so the wake-up cannot slip in between
      // its check of remaining_ and its wait.
      std::lock_guard lk(mu_);
      if (caller_asleep_) done_cv_.notify_one();
    }
  }
}

}  // namespace pmap::detail
