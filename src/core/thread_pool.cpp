#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace lily {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t b;
    {
      std::lock_guard lk(mu_);
      if (next_ >= n_) return;
      b = next_;
      next_ = std::min(n_, next_ + chunk_);
    }
    int64_t e = std::min(n_, b + chunk_);
    try {
      (*fn_)(b, e);
    } catch (...) {
      std::lock_guard lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard lk(mu_);
      pending_ -= (e - b);
      if (pending_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      ++active_;
    }
    run_chunks();
    {
      std::lock_guard lk(mu_);
      --active_;
      if (active_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard call(call_mu_);
  {
    std::lock_guard lk(mu_);
    int64_t parts = int64_t(size()) * 4;
    chunk_ = std::max(grain, (n + parts - 1) / parts);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    pending_ = n;
    error_ = nullptr;
    ++generation_;
  }
  cv_work_.notify_all();
  run_chunks();
  std::exception_ptr err;
  {
    std::unique_lock lk(mu_);
    cv_done_.wait(lk, [&] { return pending_ == 0 && active_ == 0; });
    fn_ = nullptr;
    err = error_;
  }
  if (err) std::rethrow_exception(err);
}

namespace {
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mu;
int g_threads = 0;
}  // namespace

ThreadPool& ThreadPool::global() {
  std::lock_guard lk(g_pool_mu);
  if (!g_pool) {
    int n = g_threads > 0 ? g_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    g_pool = std::make_unique<ThreadPool>(n);
  }
  return *g_pool;
}

void ThreadPool::set_global_threads(int threads) {
  std::lock_guard lk(g_pool_mu);
  g_threads = threads;
  g_pool.reset();
}

}  // namespace lily
