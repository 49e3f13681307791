// A fixed pool of worker threads with a blocking parallel_for. The calling thread takes part.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lily {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), split into chunks of at least `grain`.
  // Returns when all calls are done. Exceptions from fn are rethrown on the caller.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool (size from set_global_threads, default: hardware concurrency).
  static ThreadPool& global();
  static void set_global_threads(int threads);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, next_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex call_mu_;  // one parallel_for at a time
};

}  // namespace lily
