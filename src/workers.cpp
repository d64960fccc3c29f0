// WorkerPool: persistent per-device threads (CUDA workers bind their GPU once at start).
#include "workers.h"

#include <algorithm>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <pmap/error.h>

#include "cuda_seam.h"

namespace pmap::detail {
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
      stop_ = true;
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
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

bool WorkerPool::on_worker_thread() const { return tls_pool == this; }

void WorkerPool::run_all(const std::function<void(int)>& task) {
  std::unique_lock lk(mu_);
  task_ = &task;
  remaining_ = static_cast<int>(threads_.size());
  ++generation_;
  start_cv_.notify_all();
  done_cv_.wait(lk, [&] { return remaining_ == 0; });
  task_ = nullptr;
}

void WorkerPool::loop(int index, Device device, bool pin) {
  tls_pool = this;
  if (pin && device.is_cpu()) pin_to_core(index);
  bool bound = device.is_cpu();
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task = nullptr;
    {
      std::unique_lock lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    if (!bound) {  // a failure to bind shows up as an error of the task's first CUDA call
      try {
        cuda_bind_thread(device.ordinal);
        bound = true;
      } catch (...) {
      }
    }
    (*task)(index);
    std::lock_guard lk(mu_);
    if (--remaining_ == 0) done_cv_.notify_all();
  }
}

}  // namespace pmap::detail
