// A thinking budget (Anthropic's thinking.budget_tokens): once the reply has spent `budget` tokens
// inside its <think> block, the only token allowed is the one that closes it (</think>). Composes with
// another constraint (a grammar), whose mask it narrows; outside the block it passes that mask through.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/constraint.h"
#include "text/token_grammar.h"

namespace lily {

struct ReasoningBudgetOptions {
  int64_t budget = 0;              // reasoning tokens before </think> is forced
  int32_t close_id = -1;           // the </think> token
  bool start_in_reasoning = false; // the prompt left <think> open; otherwise a reply that starts with
                                   // <think> (after white space) opens the block
  std::shared_ptr<const text::TokenVocabulary> vocab;  // token bytes, over the model's ids
};

class ReasoningBudget : public TokenConstraint {
 public:
  // `inner` may be null (no other constraint).
  ReasoningBudget(ReasoningBudgetOptions o, std::shared_ptr<TokenConstraint> inner);
  std::span<const uint64_t> allowed() override;
  void accept(int32_t token) override;
  bool complete() const override { return inner_ && inner_->complete(); }
  std::unique_ptr<TokenConstraint> clone() const override;

  bool in_reasoning() const { return state_ == State::Reasoning; }
  int64_t spent() const { return spent_; }

 private:
  enum class State { Before, Reasoning, After };
  ReasoningBudgetOptions o_;
  std::shared_ptr<TokenConstraint> inner_;
  State state_;
  int64_t spent_ = 0;
  std::string head_, tail_;  // the reply's start (until the block opens or cannot), the last bytes
  std::vector<uint64_t> all_, forced_;
};

}  // namespace lily
