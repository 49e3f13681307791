#include "runtime/reasoning_budget.h"

#include "core/error.h"

namespace lily {

namespace {
constexpr std::string_view kOpen = "<think>", kClose = "</think>";
}

ReasoningBudget::ReasoningBudget(ReasoningBudgetOptions o, std::shared_ptr<TokenConstraint> inner)
    : o_(std::move(o)), inner_(std::move(inner)), state_(o_.start_in_reasoning ? State::Reasoning : State::Before) {
  LILY_ASSERT(o_.vocab && o_.close_id >= 0 && o_.close_id < o_.vocab->size());
  const size_t words = (size_t(o_.vocab->size()) + 63) / 64;
  forced_.assign(words, 0);
  forced_[size_t(o_.close_id) >> 6] |= uint64_t(1) << (o_.close_id & 63);
  if (!inner_) {
    all_.assign(words, ~uint64_t(0));
    if (o_.vocab->size() % 64) all_.back() = (uint64_t(1) << (o_.vocab->size() % 64)) - 1;
  }
}

std::span<const uint64_t> ReasoningBudget::allowed() {
  std::span<const uint64_t> base = inner_ ? inner_->allowed() : std::span<const uint64_t>(all_);
  if (state_ != State::Reasoning || spent_ < o_.budget) return base;
  const size_t w = size_t(o_.close_id) >> 6;
  if (w < base.size() && (base[w] >> (o_.close_id & 63) & 1)) return forced_;
  return base;  // the grammar cannot take </think> here: it decides
}

void ReasoningBudget::accept(int32_t token) {
  if (inner_) inner_->accept(token);
  static const std::string none;
  const std::string& b = token >= 0 && token < o_.vocab->size() ? o_.vocab->bytes(token) : none;
  if (state_ == State::Before) {
    for (char c : b) {
      if (head_.empty() && (c == ' ' || c == '\n' || c == '\t' || c == '\r')) continue;
      head_ += c;
      if (head_.size() >= kOpen.size()) break;
    }
    if (head_.size() >= kOpen.size() && head_.substr(0, kOpen.size()) == kOpen) {
      state_ = State::Reasoning;
      tail_.clear();
      return;  // the opening token is not reasoning
    }
    if (head_.size() < kOpen.size() ? kOpen.substr(0, head_.size()) != head_ : true) state_ = State::After;
    return;
  }
  if (state_ != State::Reasoning) return;
  ++spent_;
  tail_ += b;
  if (tail_.find(kClose) != std::string::npos) state_ = State::After;
  if (tail_.size() > kClose.size()) tail_ = tail_.substr(tail_.size() - kClose.size());
}

std::unique_ptr<TokenConstraint> ReasoningBudget::clone() const {
  auto c = std::make_unique<ReasoningBudget>(o_, inner_ ? std::shared_ptr<TokenConstraint>(inner_->clone()) : nullptr);
  c->state_ = state_;
  c->spent_ = spent_;
  c->head_ = head_;
  c->tail_ = tail_;
  return c;
}

}  // namespace lily
