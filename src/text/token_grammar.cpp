#include "text/token_grammar.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "text/tokenizer.h"

namespace lily::text {

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes) : bytes_(std::move(bytes)) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!bytes_[i].empty()) ids.push_back(int32_t(i));
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
  std::vector<uint32_t> open;  // node index per depth - 1 on the current path
  std::string_view prev;
  auto close_to = [&](size_t depth) {
    while (open.size() > depth) {
      nodes_[open.back()].end = uint32_t(nodes_.size());
      open.pop_back();
    }
  };
  for (int32_t id : ids) {
    std::string_view s = bytes_[size_t(id)];
    LILY_ASSERT(s.size() < 65535);
    size_t lcp = 0;
    while (lcp < s.size() && lcp < prev.size() && s[lcp] == prev[lcp]) ++lcp;
    close_to(lcp);
    for (size_t d = lcp; d < s.size(); ++d) {
      open.push_back(uint32_t(nodes_.size()));
      nodes_.push_back({uint8_t(s[d]), uint16_t(d + 1), 0, -1});
    }
    auto& last = nodes_[open.back()];
    if (last.token < 0) last.token = id;
    else dups_.emplace_back(open.back(), id);
    max_depth_ = std::max(max_depth_, s.size());
    prev = s;
  }
  close_to(0);
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tok, int32_t n_ids) {
  std::vector<std::string> bytes(size_t(std::max(n_ids, 0)));
  const int32_t n = std::min(n_ids, tok.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    try {
      if (!tok.is_special(id)) bytes[size_t(id)] = tok.token_bytes(id);
    } catch (const InputError&) {
      // a hole in the tokenizer's ids: never allowed
    }
  }
  return std::make_shared<TokenVocabulary>(std::move(bytes));
}

TokenGrammar::TokenGrammar(const Grammar& g, std::shared_ptr<const TokenVocabulary> vocab, std::vector<int32_t> end_ids,
                           size_t cache_bytes)
    : vocab_(std::move(vocab)), end_ids_(std::move(end_ids)), cache_bytes_(cache_bytes), dfa_(g) {
  std::erase_if(end_ids_, [&](int32_t t) { return t < 0 || t >= vocab_->size(); });
  walk_.resize(vocab_->max_depth() + 1);
  roots_.fill(kNoNode);
  const auto& trie = vocab_->trie();
  for (uint32_t i = 0; i < trie.size(); i = trie[i].end) roots_[trie[i].byte] = i;
}

uint32_t TokenGrammar::child(uint32_t node, uint8_t byte) const {
  const auto& trie = vocab_->trie();
  for (uint32_t c = node + 1; c < trie[node].end; c = trie[c].end)
    if (trie[c].byte == byte) return c;
  return kNoNode;
}

int32_t TokenGrammar::bound(State s) {
  auto known = [&](State q) {
    if (size_t(q) >= bounds_.size()) bounds_.resize(dfa_.states(), -1);
    return bounds_[size_t(q)] >= 0;
  };
  if (known(s)) return bounds_[size_t(s)];
  // Spell the shortest completion until it accepts, or until a known state and one longest token past
  // it (the states after a known one are its own completion's, known with it).
  const size_t span = vocab_->max_depth();
  path_.assign(1, s);
  path_bytes_.clear();
  size_t first_known = SIZE_MAX;
  for (;;) {
    const State q = path_.back();
    if (first_known == SIZE_MAX && known(q)) first_known = path_.size() - 1;
    if (first_known != SIZE_MAX && path_.size() - 1 >= first_known + span) break;
    const int b = dfa_.next_byte(q);
    if (b < 0) break;
    path_bytes_.push_back(char(b));
    path_.push_back(dfa_.step(q, uint8_t(b)));
  }
  // From the end: a position's bound is one more than the best position a token from it reaches.
  const auto& trie = vocab_->trie();
  path_bounds_.assign(path_.size(), kUnreachable);
  for (size_t i = path_.size(); i-- > 0;) {
    const State q = path_[i];
    int32_t& u = path_bounds_[i];
    if (known(q)) {
      u = bounds_[size_t(q)];
      continue;
    }
    if (dfa_.accepting(q)) {
      u = 0;
    } else {
      uint32_t node = kNoNode;
      for (size_t k = i; k < path_bytes_.size() && k - i < span; ++k) {
        const uint8_t byte = uint8_t(path_bytes_[k]);
        node = k == i ? roots_[byte] : child(node, byte);
        if (node == kNoNode) break;
        if (trie[node].token >= 0 && path_bounds_[k + 1] < kUnreachable) u = std::min(u, 1 + path_bounds_[k + 1]);
      }
    }
    bounds_[size_t(q)] = u;
  }
  return path_bounds_[0];
}

bool TokenGrammar::is_end(int32_t token) const {
  return std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end();
}

std::shared_ptr<TokenMask> TokenGrammar::compute(State s, int32_t max_dist) {
  auto m = std::make_shared<TokenMask>();
  m->bits.assign((size_t(vocab_->size()) + 63) / 64, 0);
  const auto& trie = vocab_->trie();
  walk_[0] = s;
  int32_t worst = 0;
  for (size_t i = 0; i < trie.size();) {
    const auto& n = trie[i];
    const State q = dfa_.step(walk_[n.depth - 1], n.byte);
    if (q == kDead) {
      i = n.end;
      continue;
    }
    walk_[n.depth] = q;
    if (n.token >= 0) {
      const int32_t d = bound(q);
      if (d <= max_dist) {
        m->bits[size_t(n.token) >> 6] |= uint64_t(1) << (n.token & 63);
        ++m->text_tokens;
        worst = std::max(worst, d);
      }
    }
    ++i;
  }
  for (auto [node, id] : vocab_->duplicates()) {
    const int32_t first = trie[node].token;
    if (m->bits[size_t(first) >> 6] >> (first & 63) & 1) {
      m->bits[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
      ++m->text_tokens;
    }
  }
  m->max_distance = worst;
  if (dfa_.accepting(s)) {
    m->end_allowed = !end_ids_.empty();
    for (int32_t t : end_ids_) {
      if (m->bits[size_t(t) >> 6] >> (t & 63) & 1) --m->text_tokens;  // an end id that is also text
      m->bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
    }
  }
  return m;
}

std::shared_ptr<const TokenMask> TokenGrammar::mask(State s, int64_t budget) {
  std::lock_guard lk(mu_);
  LILY_ASSERT(s >= 0 && size_t(s) < dfa_.states());
  auto lookup = [&](int32_t threshold) -> std::shared_ptr<const TokenMask> {
    const uint64_t key = uint64_t(uint32_t(s)) << 32 | uint32_t(threshold);
    if (auto it = cache_.find(key); it != cache_.end()) {
      ++stats_.hits;
      return it->second;
    }
    ++stats_.misses;
    std::shared_ptr<const TokenMask> m = compute(s, threshold);
    const size_t bytes = m->bits.size() * 8 + sizeof(TokenMask);
    while (cached_bytes_ + bytes > cache_bytes_ && order_head_ < order_.size()) {
      auto it = cache_.find(order_[order_head_++]);
      if (it != cache_.end()) {
        cached_bytes_ -= it->second->bits.size() * 8 + sizeof(TokenMask);
        cache_.erase(it);
      }
    }
    if (order_head_ > 4096 && order_head_ * 2 > order_.size()) {
      order_.erase(order_.begin(), order_.begin() + std::ptrdiff_t(order_head_));
      order_head_ = 0;
    }
    cache_.emplace(key, m);
    order_.push_back(key);
    cached_bytes_ += bytes;
    return m;
  };
  auto full = lookup(kNoLimit);
  // The budget matters only when some allowed token leads further from the end than it allows, and
  // only when the grammar can finish in the budget at all (otherwise nothing would be allowed). A
  // budget of 0 allows the end ids alone (a threshold of -1: no text token qualifies).
  if (budget < 0 || budget - 1 >= full->max_distance || bound(s) > budget) return full;
  return lookup(int32_t(budget - 1));
}

TokenGrammar::State TokenGrammar::advance(State s, int32_t token) {
  if (token < 0 || token >= vocab_->size()) return kDead;
  std::lock_guard lk(mu_);
  if (is_end(token)) return dfa_.accepting(s) ? s : kDead;
  const std::string& b = vocab_->bytes(token);
  if (b.empty()) return kDead;
  return dfa_.walk(s, b);
}

TokenGrammar::State TokenGrammar::advance_bytes(State s, std::string_view bytes) {
  std::lock_guard lk(mu_);
  return dfa_.walk(s, bytes);
}

bool TokenGrammar::accepting(State s) {
  std::lock_guard lk(mu_);
  return dfa_.accepting(s);
}

int32_t TokenGrammar::token_distance(State s) {
  std::lock_guard lk(mu_);
  return bound(s);
}

TokenGrammar::Stats TokenGrammar::stats() {
  std::lock_guard lk(mu_);
  Stats s = stats_;
  s.states = dfa_.states();
  s.masks = cache_.size();
  s.mask_bytes = cached_bytes_;
  s.bytes = cached_bytes_ + cache_.size() * 48 + order_.size() * 8 + dfa_.memory() + bounds_.size() * 4 + walk_.size() * 4;
  return s;
}

}  // namespace lily::text
