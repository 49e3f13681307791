#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

namespace lily {
namespace {

int spin_us() {
  static const int us = [] {
    const char* v = std::getenv("LILY_SPIN_US");
    if (!v || !*v) return 200;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    return (end && *end == 0 && x >= 0 && x <= 1000000) ? int(x) : 200;
  }();
  return us;
}

thread_local int t_in_task = 0;  // > 0 inside fn of a parallel_for (nested calls run inline)

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls pred for about spin_us() microseconds; returns its last value.
template <class Pred>
bool spin_until(Pred pred) {
  const int us = spin_us();
  if (us == 0) return pred();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if ((i & 255) == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(us)) return pred();
  }
}

}  // namespace

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
    int64_t b, e;
    const std::function<void(int64_t, int64_t)>* fn;
    {
      std::lock_guard lk(mu_);
      if (next_ >= n_) return;
      // guided: a share of what is left, at least chunk_ (the grain), so the last chunks are small and the
      // threads finish together; the boundaries depend only on n and the grain, never on which thread asks
      const int64_t left = n_ - next_, share = (left + 2 * size() - 1) / (2 * size());
      b = next_;
      e = next_ = next_ + std::min(left, std::max(chunk_, share));
      fn = fn_;
    }
    try {
      ++t_in_task;
      (*fn)(b, e);
      --t_in_task;
    } catch (...) {
      --t_in_task;
      std::lock_guard lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard lk(mu_);
      if (pending_.fetch_sub(e - b) == e - b && caller_waiting_) cv_done_.notify_all();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_relaxed); });
    {
      std::unique_lock lk(mu_);
      if (generation_.load() == seen && !stop_) {
        ++sleepers_;
        cv_work_.wait(lk, [&] { return stop_ || generation_.load() != seen; });
        --sleepers_;
      }
      if (stop_) return;
      seen = generation_.load();
      active_.fetch_add(1);
    }
    run_chunks();
    {
      std::lock_guard lk(mu_);
      if (active_.fetch_sub(1) == 1 && caller_waiting_) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain || t_in_task > 0) {  // nested: the pool is busy with the outer call
    fn(0, n);
    return;
  }
  std::lock_guard call(call_mu_);
  bool wake;
  {
    std::lock_guard lk(mu_);
    chunk_ = grain;
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    pending_.store(n);
    error_ = nullptr;
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) cv_work_.notify_all();
  run_chunks();
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0 && active_.load(std::memory_order_acquire) == 0; };
  spin_until(done);
  std::exception_ptr err;
  {
    std::unique_lock lk(mu_);
    if (!done()) {
      caller_waiting_ = true;
      cv_done_.wait(lk, done);
      caller_waiting_ = false;
    }
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
