#include "runtime/session.h"

#include <algorithm>

#include "core/error.h"
#include "model/qwen_hybrid.h"

namespace lily {

Session::Session(Engine& engine, int64_t ctx_size) : engine_(&engine) {
  state_ = engine.backend().new_state(ctx_size > 0 ? ctx_size : engine.options().ctx_size);
}

void Session::prefill(std::span<const int32_t> tokens, float* last_logits, float* all_logits) {
  const int64_t V = engine_->config().vocab;
  const int64_t chunk = engine_->options().prefill_chunk;
  const int64_t n = int64_t(tokens.size());
  if (n == 0) {
    if (last_logits && !last_logits_.empty()) std::copy(last_logits_.begin(), last_logits_.end(), last_logits);
    return;
  }
  if (n_tokens() + n > capacity())
    fail("prompt of {} tokens (+{} cached) does not fit the context size {}", n, n_tokens(), capacity());
  last_logits_.resize(static_cast<size_t>(V));
  std::vector<float> rows;
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t m = std::min(chunk, n - b);
    auto part = tokens.subspan(static_cast<size_t>(b), size_t(m));
    if (all_logits) {
      forward_step(engine_->backend(), *state_, part, m, all_logits + b * V);
      if (b + m == n) std::copy(all_logits + (n - 1) * V, all_logits + n * V, last_logits_.begin());
    } else {
      // Only the final chunk's last row is needed.
      const bool last = b + m == n;
      forward_step(engine_->backend(), *state_, part, last ? 1 : 0, last ? last_logits_.data() : nullptr);
    }
    tokens_.insert(tokens_.end(), part.begin(), part.end());
  }
  if (last_logits) std::copy(last_logits_.begin(), last_logits_.end(), last_logits);
}

void Session::decode(int32_t token, float* logits) {
  const int64_t V = engine_->config().vocab;
  if (n_tokens() + 1 > capacity()) fail("context size {} is full", capacity());
  last_logits_.resize(static_cast<size_t>(V));
  forward_step(engine_->backend(), *state_, std::span<const int32_t>(&token, 1), 1, last_logits_.data());
  tokens_.push_back(token);
  if (logits) std::copy(last_logits_.begin(), last_logits_.end(), logits);
}

void Session::note_absorbed(std::span<const int32_t> tokens, std::span<const float> logits) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  last_logits_.assign(logits.begin(), logits.end());
  LILY_ASSERT(state_->n_tokens() >= n_tokens());
}

Snapshot Session::snapshot() const {
  Snapshot s;
  s.tokens = tokens_;
  s.state = state_->snapshot();
  s.last_logits = last_logits_;
  return s;
}

void Session::restore(const Snapshot& s) {
  LILY_CHECK(s.state != nullptr, "empty snapshot");
  state_->restore(*s.state);
  tokens_ = s.tokens;
  last_logits_ = s.last_logits;
}

void Session::reset() {
  state_->reset();
  tokens_.clear();
  last_logits_.clear();
}

}  // namespace lily
