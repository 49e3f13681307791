#include "runtime/prompt_cache.h"

#include <algorithm>

namespace lily {

size_t PromptCache::entry_bytes(const Snapshot& s) {
  return s.nbytes() + s.last_logits.size() * sizeof(float) + s.tokens.size() * sizeof(int32_t);
}

std::shared_ptr<const Snapshot> PromptCache::lookup(std::span<const int32_t> tokens) {
  std::lock_guard lk(mu_);
  auto best = lru_.end();
  size_t best_len = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const auto& t = it->snap->tokens;
    if (t.size() > tokens.size() || t.size() <= best_len) continue;
    if (std::equal(t.begin(), t.end(), tokens.begin())) {
      best = it;
      best_len = t.size();
    }
  }
  if (best == lru_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, best);
  return lru_.front().snap;
}

void PromptCache::insert(std::shared_ptr<const Snapshot> s) {
  if (!s || s->tokens.empty()) return;
  size_t b = entry_bytes(*s);
  if (b > max_bytes_) return;
  std::lock_guard lk(mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->snap->tokens == s->tokens) {
      bytes_ -= it->bytes;
      lru_.erase(it);
      break;
    }
  }
  lru_.push_front({std::move(s), b});
  bytes_ += b;
  ++stats_.inserts;
  while (bytes_ > max_bytes_ && lru_.size() > 1) {
    bytes_ -= lru_.back().bytes;
    lru_.pop_back();
    ++stats_.evictions;
  }
}

void PromptCache::clear() {
  std::lock_guard lk(mu_);
  lru_.clear();
  bytes_ = 0;
}

PromptCache::Stats PromptCache::stats() const {
  std::lock_guard lk(mu_);
  Stats s = stats_;
  s.entries = lru_.size();
  s.bytes = bytes_;
  return s;
}

}  // namespace lily
