// The server's grammar cache (server/structured.h) on the real Qwen3 tokenizer: kept grammars stay
// within their byte bound as their mask caches fill, the least recently used go first, and a grammar in
// use by a request stays valid after it was dropped.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "runtime/demo_model.h"
#include "server/structured.h"
#include "text/tokenizer.h"

namespace lily::server {
namespace {

// Walks `c` for up to `steps` tokens, each time the lowest allowed id that is not an end id (filling
// the grammar's mask cache); true when the walk got that far.
bool walk(TokenConstraint& c, const std::vector<int32_t>& ends, int steps) {
  for (int i = 0; i < steps; ++i) {
    const auto m = c.allowed();
    int32_t pick = -1;
    for (size_t w = 0; w < m.size() && pick < 0; ++w)
      for (uint64_t bits = m[w]; bits && pick < 0; bits &= bits - 1) {
        const int32_t id = int32_t(w * 64 + size_t(__builtin_ctzll(bits)));
        if (std::find(ends.begin(), ends.end(), id) == ends.end()) pick = id;
      }
    if (pick < 0) return false;
    c.accept(pick);
  }
  return true;
}

TEST(StructuredCache, KeptGrammarsStayWithinTheirBytes) {
  const std::string dir = find_demo_tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  std::shared_ptr<const text::Tokenizer> tok = text::Tokenizer::load(dir);
  const size_t budget = size_t(2) << 20;
  Structured st(tok, tok->vocab_size(), tok->stop_ids(), nullptr, 32, budget);
  auto schema = [](int i) {
    return nlohmann::ordered_json::parse(fmt::format(R"({{"type": "object", "properties": {{"field_{}": {{"type": "array", "items": {{"type": "integer"}}}}}},
        "required": ["field_{}"]}})", i, i));
  };
  std::shared_ptr<TokenConstraint> first = st.json_output(schema(0), "schema", text::ReasoningMode::None, -1);
  ASSERT_TRUE(walk(*first, tok->stop_ids(), 12));
  size_t most = 0;
  for (int i = 1; i < 12; ++i) {
    auto c = st.json_output(schema(i), "schema", text::ReasoningMode::None, -1);
    const auto [n, bytes] = st.kept();
    EXPECT_TRUE(n == 1 || bytes <= budget) << n << " grammars, " << bytes << " bytes";
    most = std::max(most, n);
    ASSERT_TRUE(walk(*c, tok->stop_ids(), 24)) << "schema " << i;
  }
  EXPECT_GT(most, 1u);
  EXPECT_LT(st.kept().first, 12u) << "nothing was dropped";
  // Dropped from the cache, the first grammar still serves the request that holds it.
  EXPECT_TRUE(walk(*first, tok->stop_ids(), 12));
  // A count bound alone.
  Structured few(tok, tok->vocab_size(), tok->stop_ids(), nullptr, 3);
  for (int i = 0; i < 6; ++i) few.json_output(schema(i), "schema", text::ReasoningMode::None, -1);
  EXPECT_EQ(few.kept().first, 3u);
}

}  // namespace
}  // namespace lily::server
