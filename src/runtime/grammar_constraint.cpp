#include "runtime/grammar_constraint.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace lily {

GrammarConstraint::GrammarConstraint(std::shared_ptr<text::TokenGrammar> g, int64_t max_tokens)
    : g_(std::move(g)), state_(g_->start()), max_tokens_(max_tokens) {}

const text::TokenMask& GrammarConstraint::mask() const {
  if (!mask_) {
    // One token of the limit is kept for the end id, so that a complete document also ends the reply.
    const int64_t left = max_tokens_ - emitted_ - (g_->has_end_ids() ? 1 : 0);
    mask_ = g_->mask(state_, max_tokens_ < 0 ? -1 : std::max<int64_t>(left, 0));
  }
  return *mask_;
}

std::span<const uint64_t> GrammarConstraint::allowed() { return mask().bits; }

void GrammarConstraint::accept(int32_t token) {
  const auto& m = mask();
  if (token < 0 || size_t(token) >= m.bits.size() * 64 || !(m.bits[size_t(token) >> 6] >> (token & 63) & 1))
    throw InternalError(fmt::format("token {} is not allowed by the grammar here", token));
  if (g_->is_end(token)) {
    ended_ = true;
  } else {
    state_ = g_->advance(state_, token);
    LILY_ASSERT(state_ != text::TokenGrammar::kDead);
  }
  ++emitted_;
  mask_.reset();
}

bool GrammarConstraint::complete() const {
  if (ended_) return true;
  const auto& m = mask();
  return m.end_allowed && m.text_tokens == 0;
}

std::unique_ptr<TokenConstraint> GrammarConstraint::clone() const {
  auto c = std::make_unique<GrammarConstraint>(g_, max_tokens_);
  c->state_ = state_;
  c->emitted_ = emitted_;
  c->ended_ = ended_;
  c->mask_ = mask_;
  return c;
}

}  // namespace lily
