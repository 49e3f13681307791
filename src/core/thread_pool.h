// A fixed pool of worker threads with a blocking parallel_for. The calling thread takes part.
//
// Between jobs the workers spin for a short window (LILY_SPIN_US microseconds, default 200; 0 = never)
// before sleeping on a condition variable, and the caller spins the same window waiting for the last
// chunk: inference issues hundreds of small parallel_for calls per token, and a futex wake-up per call
// (tens of microseconds) would cost more than many of the calls themselves.
#pragma once
#include <atomic>
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
  // Returns when all calls are done. Exceptions from fn are rethrown on the caller. A call made from
  // inside fn runs inline on that thread.
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
  // Job state: written under mu_; generation_, pending_ and active_ are also read without it by the
  // spinning threads (every decision is re-checked under mu_ before sleeping).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, next_ = 0;
  std::atomic<int64_t> pending_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  int sleepers_ = 0;             // workers waiting on cv_work_
  bool caller_waiting_ = false;  // the caller waiting on cv_done_
  std::exception_ptr error_;
  std::mutex call_mu_;  // one parallel_for at a time
};

}  // namespace lily
