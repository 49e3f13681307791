// Scheduler: the one thread that runs model steps. The engine's sessions are not thread-safe, so every
// prefill chunk and every decode step of every request runs here, one step at a time, round-robin over
// the active requests (so concurrent streams interleave by step, each on its own session). Requests
// beyond the slots wait in a bounded queue; beyond that, submit() refuses them (HTTP 503).
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

#include "runtime/constraint.h"
#include "runtime/engine.h"
#include "runtime/prompt_cache.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace lily {

struct GenParams {
  std::vector<int32_t> prompt;
  // Prompt positions (0 < p < prompt.size()) where the state is also saved to the prompt cache, e.g.
  // the start of the last message. The end of the prompt and the end of the request are always saved.
  std::vector<size_t> boundaries;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int32_t sample_vocab = 0;      // ids >= this are never sampled (tokenizer smaller than the model); 0: all
  std::vector<int32_t> stop_ids; // end of generation (not shown as text, counted as a completion token)
  bool use_cache = true;
  bool prompt_logits = false;    // call on_prompt_logits for every prompt row (echo + logprobs); no cache
  // on_token needs the logits row of each token (logprobs). When false, no logit_bias is set and the
  // request runs alone, a backend that samples on the device (CUDA) decodes without per-token logits.
  bool token_logits = true;
  // Structured output / forced tool call: only ids it allows are drawn; each emitted token advances it.
  std::shared_ptr<TokenConstraint> constraint;
};

struct GenResult {
  std::string finish_reason;     // stop, length, cancelled, error
  std::string error;             // message when finish_reason == "error"
  bool error_is_input = false;   // the error was caused by the request (HTTP 400)
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double queue_ms = 0, prefill_ms = 0, decode_ms = 0, ttft_ms = 0;
};

// One request. Callbacks run on the scheduler thread and must not block for long.
class Job {
 public:
  explicit Job(GenParams p) : params(std::move(p)) {}
  virtual ~Job() = default;

  // Prompt absorbed so far (cached tokens count as absorbed), after every prefill chunk.
  virtual void on_prefill(int64_t done, int64_t total) {}
  // Rows of prompt logits for positions [first, first + rows) when params.prompt_logits.
  virtual void on_prompt_logits(int64_t first, int64_t rows, std::span<const float> logits) {}
  // A sampled token (not a stop id) and the logits row it was drawn from (empty when the params ask for
  // no token_logits and the token was drawn on the device). Return false to stop ("stop").
  virtual bool on_token(int32_t token, std::span<const float> logits) = 0;
  virtual void on_finish(const GenResult& r) = 0;

  void cancel() { cancelled.store(true); }

  GenParams params;
  std::atomic<bool> cancelled{false};
};

struct SchedulerOptions {
  int parallel = 1;            // sessions (slots) run concurrently
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
  struct Active;
  void run();
  bool step(Active& a);  // false when the job is finished
  // Decode steps with the sampler on the device until the job ends (false) or another request waits
  // (true: the job continues on the host path). Only for a job running alone; see token_logits.
  bool device_steps(Active& a);
  bool device_eligible(const Active& a);
  void start(Active& a);
  void finish(Active& a, const std::string& reason, bool eos);
  void fail_job(Active& a, const std::exception& e, bool input);

  Engine& engine_;
  SchedulerOptions opt_;
  int64_t ctx_size_;
  PromptCache cache_;
  std::vector<std::unique_ptr<Session>> slots_;
  std::vector<bool> slot_busy_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<Job>, double>> queue_;  // job, submit time (ms)
  std::vector<std::unique_ptr<Active>> active_;
  bool stop_ = false;
  SchedulerStats stats_;
  double avg_request_s_ = 1.0;
  std::thread thread_;
};

}  // namespace lily
