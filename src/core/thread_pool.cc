#include "megackpt/core/thread_pool.h"

#include <atomic>

namespace megackpt::inline core {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = new ThreadPool(0);  // never destroyed: safe at exit
  return *pool;
}

namespace {

// Shared between the caller and helper tasks; helpers that start after all
// indices are claimed touch nothing but the counters, so the caller may return
// while such late helpers are still queued.
struct ParallelForState {
  std::function<Status(size_t)> fn;
  size_t n = 0;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::condition_variable cv;
  size_t finished = 0;  // indices claimed and completed (or skipped)
  Status first_error;

  void Run() {
    while (true) {
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      Status s = failed.load() ? Status::OK() : fn(i);
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok() && first_error.ok()) {
        first_error = s;
        failed.store(true);
      }
      if (++finished == n) cv.notify_all();
    }
  }
};

}  // namespace

Status ParallelFor(ThreadPool* pool, size_t n, const std::function<Status(size_t)>& fn,
                   int max_parallel) {
  if (n == 0) return Status::OK();
  auto state = std::make_shared<ParallelForState>();
  state->fn = fn;
  state->n = n;
  if (pool != nullptr && n > 1) {
    int helpers = pool->size();
    if (max_parallel > 0) helpers = std::min(helpers, max_parallel - 1);
    helpers = static_cast<int>(std::min<size_t>(helpers, n - 1));
    for (int h = 0; h < helpers; ++h) pool->Schedule([state] { state->Run(); });
  }
  state->Run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->finished == state->n; });
  return state->first_error;
}

}  // namespace megackpt::inline core
