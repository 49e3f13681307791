// Scheduler: the one thread that runs model steps. Requests take a slot (a session) and advance together
// through the generation loop (runtime/loop.h): every step holds one row of each decoding request and
// prompt chunks of the waiting ones (continuous batching). Requests beyond the slots wait in a bounded
// queue; beyond that, submit() refuses them (HTTP 503).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/loop.h"
#include "runtime/prompt_cache.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace lily {

struct SchedulerOptions {
  int parallel = 1;            // sessions (slots) run concurrently
  int64_t step_tokens = 0;     // rows per step when prompts wait (0: the engine's prefill chunk)
  int max_queue = 16;          // requests waiting for a slot
  int64_t ctx_size = 0;        // per-slot context; 0: the engine's
  size_t cache_bytes = size_t(2048) << 20;
};

struct SchedulerStats {
  uint64_t submitted = 0, rejected = 0, completed = 0, cancelled = 0, failed = 0;
  uint64_t prompt_tokens = 0, prefilled_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  int active = 0, queued = 0;
  PromptCache::Stats cache;
  SpecStats spec;  // speculative rounds of finished requests
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& opt);
  ~Scheduler();  // stop()

  // Ends the thread after the current step; queued and active jobs finish as "cancelled" and later
  // submissions are refused.
  void stop();

  // Queues a job; false when the queue is full (nothing is called on the job then).
  bool submit(std::shared_ptr<Job> job);
  SchedulerStats stats() const;
  // Seconds a refused client should wait before retrying (a rough estimate).
  int retry_after_seconds() const;

  Engine& engine() { return engine_; }
  int64_t ctx_size() const { return ctx_size_; }
  PromptCache& cache() { return cache_; }

 private:
  void run();

  Engine& engine_;
  SchedulerOptions opt_;
  int64_t ctx_size_;
  PromptCache cache_;
  std::vector<std::unique_ptr<Session>> slots_;
  std::vector<Session*> free_;
  std::unique_ptr<GenerationLoop> loop_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<Job>, double>> queue_;  // job, submit time (ms)
  bool stop_ = false;
  SchedulerStats stats_;
  double avg_request_s_ = 1.0;
  std::thread thread_;
};

}  // namespace lily
