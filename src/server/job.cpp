#include "server/job.h"

#include <chrono>

#include "runtime/sampler.h"

namespace lily::server {

void Channel::push(Event e) {
  {
    std::lock_guard lk(mu_);
    q_.push_back(std::move(e));
  }
  cv_.notify_one();
}

std::optional<Event> Channel::pop(int timeout_ms) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return !q_.empty(); })) return std::nullopt;
  Event e = std::move(q_.front());
  q_.pop_front();
  return e;
}

GenJob::GenJob(GenParams p, std::shared_ptr<const text::Tokenizer> tok, std::vector<std::string> stops,
               std::unique_ptr<OutputStream> parser, int top_logprobs, bool progress)
    : Job(std::move(p)), tok_(std::move(tok)), filter_(std::move(stops)), parser_(std::move(parser)),
      top_logprobs_(top_logprobs), progress_(progress) {}

bool GenJob::check_deadline() {
  if (expired_) return true;
  if (!deadline_ || Clock::now() < *deadline_) return false;
  expired_ = true;
  cancel();
  return true;
}

void GenJob::on_prefill(int64_t done, int64_t total) {
  check_deadline();
  if (!progress_) return;
  Event e;
  e.kind = Event::Progress;
  e.done = done;
  e.total = total;
  channel.push(std::move(e));
}

void GenJob::on_prompt_logits(int64_t first, int64_t rows, std::span<const float> logits) {
  const auto& prompt = params.prompt;
  const size_t V = logits.size() / size_t(rows);
  Event e;
  e.kind = Event::PromptItems;
  if (first == 0) e.items.push_back(item(prompt[0], std::nullopt, {}));
  for (int64_t r = 0; r < rows; ++r) {
    size_t pos = size_t(first + r) + 1;
    if (pos >= prompt.size()) break;
    auto row = logits.subspan(size_t(r) * V, V);
    e.items.push_back(item(prompt[pos], token_logprob(row, prompt[pos]), top_logprobs(row, std::max(0, top_logprobs_))));
  }
  channel.push(std::move(e));
}

bool GenJob::on_token(int32_t t, std::span<const float> logits) {
  last_token_ = Clock::now();
  if (!first_token_) first_token_ = last_token_;
  std::string_view bytes;
  if (tok_ && t < tok_->vocab_size() && !tok_->is_special(t)) bytes = tok_->token_bytes(t);
  if (top_logprobs_ >= 0) {
    pending_.push_back({total_bytes_, total_bytes_ + bytes.size(),
                        item(t, token_logprob(logits, t), top_logprobs(logits, top_logprobs_))});
  }
  total_bytes_ += bytes.size();
  ids_.push_back(t);
  if (parser_ && parser_->in_reasoning()) ++reasoning_tokens_;
  Event e;
  std::string txt = filter_.push(bytes);
  if (!txt.empty()) e.delta = split(txt);
  release(e, false);
  if (!e.delta.empty() || !e.items.empty()) channel.push(std::move(e));
  const bool calls_done = max_tool_calls_ > 0 && parser_ && parser_->tool_calls() >= max_tool_calls_;
  return !filter_.stopped() && !calls_done && !check_deadline();
}

void GenJob::on_finish(const GenResult& r) {
  Event e;
  std::string txt = filter_.finish();
  if (!txt.empty()) e.delta = split(txt);
  if (parser_) e.delta.append(parser_->finish());
  release(e, true);
  if (!e.delta.empty() || !e.items.empty()) channel.push(std::move(e));
  Event f;
  f.kind = Event::Final;
  f.result = r;
  if (expired_ && (r.finish_reason == "cancelled" || r.finish_reason == "stop") && !filter_.stopped()) f.result.finish_reason = "length";
  if (first_token_) f.stream_ms = std::chrono::duration<double, std::milli>(*last_token_ - *first_token_).count();
  if (stats && ids_.size() > 1) {
    stats->intervals += uint64_t(ids_.size() - 1);
    stats->micros += uint64_t(f.stream_ms * 1e3);
  }
  f.reasoning_tokens = reasoning_tokens_;
  f.tool_calls = parser_ ? parser_->tool_calls() : 0;
  f.ids = ids_;
  if (filter_.stopped()) f.stop_sequence = filter_.matched();
  channel.push(std::move(f));
}

LogprobItem GenJob::item(int32_t id, std::optional<float> lp, std::vector<std::pair<int32_t, float>> top) {
  LogprobItem it;
  it.id = id;
  if (tok_ && id < tok_->vocab_size()) it.bytes = tok_->token_bytes(id);
  it.lp = lp;
  it.top = std::move(top);
  return it;
}

OutputDelta GenJob::split(const std::string& txt) {
  if (parser_) return parser_->push(txt);
  OutputDelta d;
  d.content = txt;
  return d;
}

// Logprob items are released with the text they produced; tokens swallowed by a stop string are not.
void GenJob::release(Event& e, bool final) {
  size_t emitted = filter_.emitted_bytes();
  while (!pending_.empty()) {
    auto& p = pending_.front();
    bool out = final ? (p.start < emitted || (p.start == p.end && p.start <= emitted && !filter_.stopped()))
                     : p.end <= emitted;
    if (!out) {
      if (final) pending_.pop_front();
      else break;
      continue;
    }
    e.items.push_back(std::move(p.item));
    pending_.pop_front();
  }
}

}  // namespace lily::server
