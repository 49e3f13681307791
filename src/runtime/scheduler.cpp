#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "runtime/generate.h"

namespace lily {

namespace {
double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

struct Scheduler::Active {
  std::shared_ptr<Job> job;
  int slot = -1;
  Session* s = nullptr;
  bool started = false;
  size_t pos = 0;  // prompt tokens absorbed (cached ones included)
  std::vector<float> logits, biased;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> generated;
  GenResult res;
  double t_submit = 0, t_start = 0;
};

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt)
    : engine_(engine), opt_(opt), ctx_size_(opt.ctx_size > 0 ? opt.ctx_size : engine.options().ctx_size),
      cache_(opt.cache_bytes) {
  LILY_CHECK(opt.parallel >= 1, "--parallel must be at least 1 (got {})", opt.parallel);
  LILY_CHECK(opt.max_queue >= 0, "queue length must be >= 0 (got {})", opt.max_queue);
  for (int i = 0; i < opt.parallel; ++i) slots_.push_back(std::make_unique<Session>(engine_, ctx_size_));
  slot_busy_.assign(size_t(opt.parallel), false);
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
  for (;;) {
    {
      std::unique_lock lk(mu_);
      for (int i = 0; i < opt_.parallel && !queue_.empty(); ++i) {
        if (slot_busy_[size_t(i)]) continue;
        auto a = std::make_unique<Active>();
        a->job = std::move(queue_.front().first);
        a->t_submit = queue_.front().second;
        queue_.pop_front();
        a->slot = i;
        a->s = slots_[size_t(i)].get();
        slot_busy_[size_t(i)] = true;
        active_.push_back(std::move(a));
      }
      stats_.active = int(active_.size());
      stats_.queued = int(queue_.size());
      if (stop_) break;
      if (active_.empty()) {
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        continue;
      }
    }
    // One step of each active request, in admission order.
    for (size_t i = 0; i < active_.size();) {
      if (step(*active_[i])) {
        ++i;
      } else {
        std::lock_guard lk(mu_);
        slot_busy_[size_t(active_[i]->slot)] = false;
        active_.erase(active_.begin() + std::ptrdiff_t(i));
        stats_.active = int(active_.size());
      }
    }
  }
  // Shutting down: everything left ends as cancelled.
  for (auto& a : active_) finish(*a, "cancelled", false);
  active_.clear();
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

void Scheduler::start(Active& a) {
  a.started = true;
  a.t_start = now_ms();
  a.res.queue_ms = a.t_start - a.t_submit;
  const auto& p = a.job->params;
  a.res.prompt_tokens = int64_t(p.prompt.size());
  if (p.prompt.empty()) fail("the prompt is empty");
  if (int64_t(p.prompt.size()) >= a.s->capacity())
    fail("the prompt has {} tokens but the context size is {}", p.prompt.size(), a.s->capacity());
  const int64_t V = engine_.config().vocab;
  for (int32_t t : p.prompt)
    if (t < 0 || t >= V) fail("prompt token id {} is outside the model's vocabulary (0..{})", t, V - 1);
  a.sampler = std::make_unique<Sampler>(p.sampling);
  a.pos = 0;
  if (p.use_cache && !p.prompt_logits) {
    if (auto snap = cache_.lookup(p.prompt); snap && !snap->last_logits.empty()) {
      a.s->restore(*snap);
      a.pos = snap->tokens.size();
      a.logits = snap->last_logits;
      a.res.cached_tokens = int64_t(a.pos);
      return;
    }
  }
  a.s->reset();
}

bool Scheduler::step(Active& a) {
  auto& job = *a.job;
  const auto& p = job.params;
  if (job.cancelled.load()) {
    finish(a, "cancelled", false);
    return false;
  }
  try {
    if (!a.started) start(a);
    const int64_t V = engine_.config().vocab;
    if (a.pos < p.prompt.size()) {
      size_t end = std::min(p.prompt.size(), a.pos + size_t(engine_.options().prefill_chunk));
      bool at_boundary = false;
      for (size_t b : p.boundaries)
        if (b > a.pos && b <= end && b < p.prompt.size()) {
          end = b;
          at_boundary = true;
        }
      std::span<const int32_t> part(p.prompt.data() + a.pos, end - a.pos);
      a.logits.resize(size_t(V));
      double t0 = now_ms();
      if (p.prompt_logits) {
        std::vector<float> rows(part.size() * size_t(V));
        a.s->prefill(part, a.logits.data(), rows.data());
        job.on_prompt_logits(int64_t(a.pos), int64_t(part.size()), rows);
      } else {
        a.s->prefill(part, a.logits.data());
      }
      a.res.prefill_ms += now_ms() - t0;
      a.pos = end;
      if (p.use_cache && !p.prompt_logits && (at_boundary || a.pos == p.prompt.size()))
        cache_.insert(std::make_shared<Snapshot>(a.s->snapshot()));
      job.on_prefill(int64_t(a.pos), int64_t(p.prompt.size()));
      return true;
    }

    if (device_eligible(a)) return device_steps(a);
    // Decode: sample from the current logits, hand the token over, then feed it back.
    std::span<const float> row(a.logits);
    if (!p.logit_bias.empty() || (p.sample_vocab > 0 && p.sample_vocab < V) || p.constraint) {
      a.biased = a.logits;
      for (auto [t, b] : p.logit_bias)
        if (t >= 0 && t < V) a.biased[size_t(t)] += b;
      if (p.sample_vocab > 0)
        for (int64_t t = p.sample_vocab; t < V; ++t) a.biased[size_t(t)] = -INFINITY;
      if (p.constraint) {
        const std::span<const uint64_t> m = p.constraint->allowed();
        LILY_ASSERT(int64_t(m.size()) * 64 >= V);
        for (int64_t t = 0; t < V; ++t)
          if (!(m[size_t(t >> 6)] >> (t & 63) & 1)) a.biased[size_t(t)] = -INFINITY;
      }
      row = a.biased;
    }
    const int32_t tok = a.sampler->sample(row, a.generated);
    if (p.constraint) p.constraint->accept(tok);
    a.generated.push_back(tok);
    a.res.completion_tokens = int64_t(a.generated.size());
    if (a.generated.size() == 1) a.res.ttft_ms = now_ms() - a.t_start;
    if (std::find(p.stop_ids.begin(), p.stop_ids.end(), tok) != p.stop_ids.end()) {
      finish(a, "stop", true);
      return false;
    }
    if (!job.on_token(tok, a.logits)) {
      finish(a, "stop", false);
      return false;
    }
    if (int64_t(a.generated.size()) >= p.max_tokens || a.s->n_tokens() + 1 > a.s->capacity()) {
      finish(a, "length", false);
      return false;
    }
    double t0 = now_ms();
    a.s->decode(tok, a.logits.data());
    a.res.decode_ms += now_ms() - t0;
    return true;
  } catch (const InputError& e) {
    fail_job(a, e, true);
  } catch (const std::exception& e) {
    fail_job(a, e, false);
  }
  return false;
}

bool Scheduler::device_eligible(const Active& a) {
  const auto& p = a.job->params;
  if (p.token_logits || !p.logit_bias.empty() || p.constraint || !engine_.backend().can_decode_on_device()) return false;
  if (int64_t(a.generated.size()) >= p.max_tokens || a.s->n_tokens() + 1 > a.s->capacity()) return false;
  std::lock_guard lk(mu_);
  return active_.size() == 1 && queue_.empty() && !stop_;
}

bool Scheduler::device_steps(Active& a) {
  auto& job = *a.job;
  const auto& p = job.params;
  const int64_t V = engine_.config().vocab;
  DeviceDecode req;
  req.sampling = device_sampling(p.sampling);
  const std::vector<int32_t> history = a.generated;  // on_tok below appends to a.generated
  req.history = history;
  req.stop_ids = p.stop_ids;
  req.max_tokens = p.max_tokens - int64_t(a.generated.size());
  req.vocab_limit = p.sample_vocab > 0 && p.sample_vocab < V ? p.sample_vocab : 0;
  enum class Why { Ended, StopId, JobStop, Cancelled, Yield } why = Why::Ended;
  auto on_tok = [&](int32_t tok) {
    a.generated.push_back(tok);
    a.res.completion_tokens = int64_t(a.generated.size());
    if (a.generated.size() == 1) a.res.ttft_ms = now_ms() - a.t_start;
    // the host path's order: a stop id ends the job without reaching on_token
    if (std::find(p.stop_ids.begin(), p.stop_ids.end(), tok) != p.stop_ids.end()) { why = Why::StopId; return false; }
    if (!job.on_token(tok, {})) { why = Why::JobStop; return false; }
    if (job.cancelled.load()) { why = Why::Cancelled; return false; }
    if (int64_t(a.generated.size()) < p.max_tokens) {
      std::lock_guard lk(mu_);
      if (!queue_.empty() || stop_) { why = Why::Yield; return false; }
    }
    return true;
  };
  const double t0 = now_ms();
  const DeviceDecodeResult r = a.s->decode_on_device(req, on_tok);
  a.res.decode_ms += now_ms() - t0;
  a.logits = a.s->last_logits();
  // Every emitted token the context could hold is in the state (the stop id too), so a stop needs no
  // extra step to absorb it, and a yielded job samples its next token from last_logits on the host.
  const bool all_absorbed = r.absorbed == int64_t(r.tokens.size());
  switch (why) {
    case Why::StopId: finish(a, "stop", !all_absorbed); return false;
    case Why::JobStop: finish(a, "stop", false); return false;
    case Why::Cancelled: finish(a, "cancelled", false); return false;
    case Why::Yield:
      if (all_absorbed) return true;
      break;
    case Why::Ended: break;
  }
  finish(a, "length", false);  // max_tokens, or the context is full
  return false;
}

void Scheduler::finish(Active& a, const std::string& reason, bool eos) {
  a.res.finish_reason = reason;
  const auto& p = a.job->params;
  a.job->on_finish(a.res);
  // Keep the end of the request for the next turn of the conversation: with a stop id, the state
  // absorbs that token too, since the conversation's next prompt repeats it.
  bool keep = a.started && p.use_cache && !p.prompt_logits && reason != "cancelled" && reason != "error" &&
              a.pos == p.prompt.size();
  if (keep) {
    try {
      if (eos && a.s->n_tokens() + 1 <= a.s->capacity()) {
        a.logits.resize(size_t(engine_.config().vocab));
        a.s->decode(a.generated.back(), a.logits.data());
      }
      cache_.insert(std::make_shared<Snapshot>(a.s->snapshot()));
    } catch (const std::exception&) {
      // The answer is already delivered; a failed cache save only costs a later prefill.
    }
  }
  std::lock_guard lk(mu_);
  if (reason == "cancelled") ++stats_.cancelled;
  else if (reason == "error") ++stats_.failed;
  else ++stats_.completed;
  stats_.prompt_tokens += uint64_t(a.res.prompt_tokens);
  stats_.cached_tokens += uint64_t(a.res.cached_tokens);
  stats_.prefilled_tokens += uint64_t(std::max<int64_t>(0, int64_t(a.pos) - a.res.cached_tokens));
  stats_.generated_tokens += uint64_t(a.res.completion_tokens);
  stats_.prefill_seconds += a.res.prefill_ms / 1e3;
  stats_.decode_seconds += a.res.decode_ms / 1e3;
  if (a.started) {
    double s = (now_ms() - a.t_start) / 1e3;
    avg_request_s_ = 0.8 * avg_request_s_ + 0.2 * s;
  }
}

void Scheduler::fail_job(Active& a, const std::exception& e, bool input) {
  a.res.error = e.what();
  a.res.error_is_input = input;
  finish(a, "error", false);
}

}  // namespace lily
