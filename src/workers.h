// WorkerPool: one persistent thread per local device. run_all hands every worker the same task and blocks
// until all have finished it.
//
// A hand-off through a condition variable costs a sleep and a wake-up each way (tens of microseconds), more
// than a small pmapped function. So both sides first poll briefly (about 50 us, yielding the core while
// they poll, so a spinning thread never keeps a runnable one waiting) and only then sleep: back-to-back
// pmap calls pass their tasks and completions in about a microsecond, and a pool left idle sleeps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <pmap/detail/task_ref.h>
#include <pmap/device.h>

namespace pmap::detail {

// On a worker thread of a CUDA device whose binding to its GPU (cudaSetDevice) failed before the current
// task: rethrows that error, so the task fails with it instead of running against another GPU's context
// (review L2). Does nothing elsewhere.
void rethrow_worker_bind_error();

class WorkerPool {
 public:
  WorkerPool(const std::vector<Device>& devices, bool pin_threads);
  ~WorkerPool();  // stops and joins every thread
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs task(i) on worker i, for every worker, concurrently. task must not throw. One run_all at a time.
  void run_all(TaskRef task);
  // True on one of this pool's worker threads.
  bool on_worker_thread() const;

 private:
  void loop(int index, Device device, bool pin);
  // Polls until pred() holds or the poll budget is spent; returns pred().
  template <class P> static bool poll(const P& pred);

  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const TaskRef* task_ = nullptr;
  std::atomic<std::uint64_t> generation_{0};  // bumped (under mu_) to start a task
  std::atomic<int> remaining_{0};              // workers still running the current task
  std::atomic<bool> stop_{false};
  int sleepers_ = 0;            // workers asleep on start_cv_ (under mu_)
  bool caller_asleep_ = false;  // run_all asleep on done_cv_ (under mu_)
  std::vector<std::thread> threads_;
};

}  // namespace pmap::detail
