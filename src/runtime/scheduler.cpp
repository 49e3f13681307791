#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "runtime/generate.h"

namespace lily {

namespace {
double now_ms() { return GenerationLoop::now_ms(); }
}  // namespace

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt)
    : engine_(engine), opt_(opt), ctx_size_(opt.ctx_size > 0 ? opt.ctx_size : engine.options().ctx_size),
      cache_(opt.cache_bytes) {
  LILY_CHECK(opt.parallel >= 1, "--parallel must be at least 1 (got {})", opt.parallel);
  LILY_CHECK(opt.max_queue >= 0, "queue length must be >= 0 (got {})", opt.max_queue);
  for (int i = 0; i < opt.parallel; ++i) slots_.push_back(std::make_unique<Session>(engine_, ctx_size_));
  for (auto it = slots_.rbegin(); it != slots_.rend(); ++it) free_.push_back(it->get());
  LoopOptions lo;
  lo.step_tokens = opt.step_tokens;
  lo.cache = &cache_;
  loop_ = std::make_unique<GenerationLoop>(engine_, lo);
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lk(mu_);
    if (stop_ || int(queue_.size()) + stats_.active >= opt_.parallel + opt_.max_queue) {
      ++stats_.rejected;
      return false;
    }
    queue_.emplace_back(std::move(job), now_ms());
    ++stats_.submitted;
    stats_.queued = int(queue_.size());
  }
  cv_.notify_all();
  return true;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  SchedulerStats s = stats_;
  s.cache = cache_.stats();
  return s;
}

int Scheduler::retry_after_seconds() const {
  std::lock_guard lk(mu_);
  double s = avg_request_s_ * double(queue_.size() + 1) / double(opt_.parallel);
  return int(std::clamp(std::ceil(s), 1.0, 60.0));
}

void Scheduler::run() {
  auto account = [&](const std::vector<GenerationLoop::Finished>& done) {
    std::lock_guard lk(mu_);
    for (const auto& f : done) {
      free_.push_back(f.session);
      const GenResult& r = f.result;
      const std::string& why = r.finish_reason;
      if (why == "cancelled") ++stats_.cancelled;
      else if (why == "error") ++stats_.failed;
      else ++stats_.completed;
      stats_.prompt_tokens += uint64_t(r.prompt_tokens);
      stats_.cached_tokens += uint64_t(r.cached_tokens);
      stats_.prefilled_tokens += uint64_t(std::max<int64_t>(0, r.prompt_tokens - r.cached_tokens));
      stats_.generated_tokens += uint64_t(r.completion_tokens);
      stats_.prefill_seconds += r.prefill_ms / 1e3;
      stats_.decode_seconds += r.decode_ms / 1e3;
      stats_.spec.merge(r.spec);
      const double s = (r.prefill_ms + r.decode_ms) / 1e3;
      if (s > 0) avg_request_s_ = 0.8 * avg_request_s_ + 0.2 * s;
    }
    stats_.active = int(loop_->size());
  };
  for (;;) {
    {
      std::unique_lock lk(mu_);
      while (!free_.empty() && !queue_.empty()) {
        Session* s = free_.back();
        free_.pop_back();
        s->reset();
        loop_->add(std::move(queue_.front().first), *s, queue_.front().second);
        queue_.pop_front();
      }
      stats_.active = int(loop_->size());
      stats_.queued = int(queue_.size());
      if (stop_) break;
      if (loop_->empty()) {
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        continue;
      }
    }
    account(loop_->step());
  }
  // Shutting down: everything left ends as cancelled.
  account(loop_->cancel_all());
  std::deque<std::pair<std::shared_ptr<Job>, double>> rest;
  {
    std::lock_guard lk(mu_);
    rest.swap(queue_);
  }
  for (auto& [job, t] : rest) {
    GenResult r;
    r.finish_reason = "cancelled";
    r.prompt_tokens = int64_t(job->params.prompt.size());
    job->on_finish(r);
  }
}

}  // namespace lily
