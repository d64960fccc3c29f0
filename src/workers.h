// WorkerPool: one persistent thread per local device. run_all hands every worker the same task and
// blocks until all have finished it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <pmap/device.h>

namespace pmap::detail {

class WorkerPool {
 public:
  WorkerPool(const std::vector<Device>& devices, bool pin_threads);
  ~WorkerPool();  // stops and joins every thread
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs task(i) on worker i, for every worker, concurrently. task must not throw.
  void run_all(const std::function<void(int)>& task);
  // True on one of this pool's worker threads.
  bool on_worker_thread() const;

 private:
  void loop(int index, Device device, bool pin);

  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  std::uint64_t generation_ = 0;
  int remaining_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace pmap::detail
