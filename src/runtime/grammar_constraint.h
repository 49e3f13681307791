// TokenConstraint over a grammar compiled against the tokenizer's vocabulary (text/token_grammar.h):
// structured outputs and forced tool calls. The end-of-generation ids are allowed exactly where the
// grammar accepts, and a request's max_tokens is kept in view: a token is allowed only when the
// grammar can still finish in the tokens left after it, one kept for the end id, so the output is a
// complete document followed by the end id whenever max_tokens leaves room for the shortest one and
// that id (TokenGrammar::token_distance(start) + 1).
#pragma once
#include <memory>

#include "runtime/constraint.h"
#include "text/token_grammar.h"

namespace lily {

class GrammarConstraint : public TokenConstraint {
 public:
  // max_tokens: the request's limit (< 0: none).
  GrammarConstraint(std::shared_ptr<text::TokenGrammar> g, int64_t max_tokens);
  std::span<const uint64_t> allowed() override;
  void accept(int32_t token) override;
  bool complete() const override;
  std::unique_ptr<TokenConstraint> clone() const override;

  bool accepting() const { return g_->accepting(state_); }

 private:
  const text::TokenMask& mask() const;

  std::shared_ptr<text::TokenGrammar> g_;
  text::TokenGrammar::State state_;
  int64_t max_tokens_, emitted_ = 0;
  bool ended_ = false;  // an end id was accepted
  mutable std::shared_ptr<const text::TokenMask> mask_;
};

}  // namespace lily
