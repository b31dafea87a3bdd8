// A small fixed-size thread pool and a deadlock-free ParallelFor.
#ifndef MEGACKPT_CORE_THREAD_POOL_H_
#define MEGACKPT_CORE_THREAD_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "megackpt/core/status.h"

namespace megackpt::inline core {

class ThreadPool {
 public:
  // num_threads <= 0 means std::thread::hardware_concurrency() (at least 1).
  explicit ThreadPool(int num_threads = 0);
  // Runs every task already scheduled, then joins the threads.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  // Queues `fn` to run on some pool thread.
  void Schedule(std::function<void()> fn);

  // Queues `fn` and returns a future of its result.
  template <typename F>
  auto Submit(F fn) -> std::future<std::invoke_result_t<F>> {
    using R = std::invoke_result_t<F>;
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
    std::future<R> fut = task->get_future();
    Schedule([task] { (*task)(); });
    return fut;
  }

  // A process-wide pool sized to the machine, created on first use.
  static ThreadPool& Default();

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Runs fn(i) for every i in [0, n), on up to `max_parallel` threads (the caller's
// thread takes part, so calling this from inside a pool task never deadlocks).
// Returns the first non-OK status (by index order of discovery); after an error,
// indices not yet started are skipped. pool == nullptr runs everything inline.
Status ParallelFor(ThreadPool* pool, size_t n, const std::function<Status(size_t)>& fn,
                   int max_parallel = 0);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_THREAD_POOL_H_
