// The thinking budget: after `budget` tokens inside <think>, only </think> may come; before the block
// opens and after it closes, the inner constraint (or nothing) decides.
#include <gtest/gtest.h>

#include "runtime/grammar_constraint.h"
#include "runtime/reasoning_budget.h"
#include "text/output_grammar.h"

namespace lily {
namespace {

// ids: 0 "<think>", 1 "</think>", 2 " hmm", 3 "\n", 4 "</", 5 "think>", 6 "{}", 7 end
std::shared_ptr<const text::TokenVocabulary> vocab() {
  return std::make_shared<text::TokenVocabulary>(std::vector<std::string>{"<think>", "</think>", " hmm", "\n", "</", "think>", "{}", ""});
}

std::vector<int32_t> ids(std::span<const uint64_t> m, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i)
    if (m[size_t(i) >> 6] >> (i & 63) & 1) out.push_back(i);
  return out;
}

TEST(ReasoningBudget, ForcesTheCloseAfterTheBudget) {
  ReasoningBudgetOptions o{2, 1, false, vocab()};
  ReasoningBudget b(o, nullptr);
  EXPECT_EQ(ids(b.allowed(), 8).size(), 8u);
  b.accept(3);  // white space before the block
  b.accept(0);  // <think>
  EXPECT_TRUE(b.in_reasoning());
  b.accept(2);
  EXPECT_EQ(ids(b.allowed(), 8).size(), 8u);
  b.accept(2);
  EXPECT_EQ(ids(b.allowed(), 8), std::vector<int32_t>{1});
  b.accept(1);
  EXPECT_FALSE(b.in_reasoning());
  EXPECT_EQ(ids(b.allowed(), 8).size(), 8u);
}

TEST(ReasoningBudget, CloseSpelledAcrossTokensEndsTheBlock) {
  ReasoningBudget b(ReasoningBudgetOptions{1, 1, true, vocab()}, nullptr);
  b.accept(4);
  EXPECT_EQ(ids(b.allowed(), 8), std::vector<int32_t>{1});
  ReasoningBudget c(ReasoningBudgetOptions{5, 1, true, vocab()}, nullptr);
  c.accept(4);
  c.accept(5);
  EXPECT_FALSE(c.in_reasoning());
  ReasoningBudget d(ReasoningBudgetOptions{1, 1, false, vocab()}, nullptr);
  d.accept(6);  // the reply did not open a block: no budget applies
  d.accept(2);
  EXPECT_EQ(ids(d.allowed(), 8).size(), 8u);
}

TEST(ReasoningBudget, NarrowsAGrammar) {
  auto v = vocab();
  auto g = std::make_shared<text::TokenGrammar>(text::json_output_grammar(nullptr, "schema", text::ReasoningMode::Open), v,
                                                std::vector<int32_t>{7});
  ReasoningBudget b(ReasoningBudgetOptions{1, 1, true, v}, std::make_shared<GrammarConstraint>(g, -1));
  b.accept(2);
  EXPECT_EQ(ids(b.allowed(), 8), std::vector<int32_t>{1});
  b.accept(1);
  EXPECT_EQ(ids(b.allowed(), 8), (std::vector<int32_t>{3, 6}));  // the grammar: "\n" or the object
  b.accept(6);
  EXPECT_TRUE(b.complete());
  EXPECT_EQ(ids(b.allowed(), 8), std::vector<int32_t>{7});
}

}  // namespace
}  // namespace lily
