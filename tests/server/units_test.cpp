// Stop strings over a byte stream, and the prompt cache's prefix lookup and memory cap.
#include <gtest/gtest.h>

#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/prompt_cache.h"
#include "runtime/session.h"
#include "server/stop_filter.h"

namespace lily::server {
namespace {

std::string feed(StopFilter& f, const std::vector<std::string>& pieces) {
  std::string out;
  for (auto& p : pieces) out += f.push(p);
  return out + f.finish();
}

TEST(StopFilter, MatchesAcrossPiecesWithoutLeaking) {
  StopFilter f({"END"});
  EXPECT_EQ(f.push("hello E"), "hello ");  // "E" could start the stop string: held
  EXPECT_EQ(f.push("N"), "");
  EXPECT_EQ(f.push("D and more"), "");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.matched(), "END");
  EXPECT_EQ(f.finish(), "");
}

TEST(StopFilter, FalseStartIsReleased) {
  StopFilter f({"END"});
  EXPECT_EQ(f.push("an E"), "an ");
  EXPECT_EQ(f.push("Nx"), "ENx");
  EXPECT_FALSE(f.stopped());
  EXPECT_EQ(f.push("EN"), "");
  EXPECT_EQ(f.finish(), "EN");  // a partial match at the end is ordinary text
}

TEST(StopFilter, EarliestOfSeveralAndEveryPieceSize) {
  const std::string text = "one two three four five";
  for (size_t step : {1, 2, 3, 5, 7, 100}) {
    StopFilter f({"four", "two th", "e f"});
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size(); i += step) pieces.push_back(text.substr(i, step));
    EXPECT_EQ(feed(f, pieces), "one ") << step;
    EXPECT_EQ(f.matched(), "two th");
  }
}

// Found by fuzz/fuzz_stop_filter: a stop string that completes while a longer one starting earlier may
// still complete must wait, or the stop (and the text released) depends on how the tokens split it.
TEST(StopFilter, LongerStopStartingEarlierWaitsToResolve) {
  for (size_t step : {1, 2, 3, 4}) {
    const std::string text = "xabcdy";
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size(); i += step) pieces.push_back(text.substr(i, step));
    StopFilter f({"abcd", "bc"});
    EXPECT_EQ(feed(f, pieces), "x") << step;
    EXPECT_EQ(f.matched(), "abcd") << step;
  }
  StopFilter g({"abcd", "bc"});
  EXPECT_EQ(g.push("xab"), "x");
  EXPECT_EQ(g.push("c"), "");  // "bc" is complete, "abcd" may still be
  EXPECT_FALSE(g.stopped());
  EXPECT_EQ(g.push("z"), "a");  // "abcd" failed: "bc" wins
  EXPECT_TRUE(g.stopped());
  EXPECT_EQ(g.matched(), "bc");
  StopFilter h({"abcd", "bc"});
  EXPECT_EQ(h.push("xabc"), "x");
  EXPECT_EQ(h.finish(), "a");  // the generation ended first: the complete one stops it
  EXPECT_TRUE(h.stopped());
}

TEST(StopFilter, HoldsIncompleteUtf8) {
  StopFilter f({});
  const std::string s = "a\xe4\xbd\xa0" "b";  // a你b
  EXPECT_EQ(f.push(s.substr(0, 2)), "a");
  EXPECT_EQ(f.push(s.substr(2, 1)), "");
  EXPECT_EQ(f.push(s.substr(3)), "\xe4\xbd\xa0" "b");
  StopFilter g({});
  EXPECT_EQ(g.push("x\xe4\xbd"), "x");
  EXPECT_EQ(g.finish(), "\xef\xbf\xbd");  // cut-off character becomes U+FFFD
}

TEST(StopFilter, EmittedBytesCountsReleasedInput) {
  StopFilter f({"<stop>"});
  f.push("abc<st");
  EXPECT_EQ(f.emitted_bytes(), 3u);
  f.push("op>tail");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.emitted_bytes(), 3u);
}

class PromptCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine = Engine::from_weights(ModelWeights::load(std::string(LILY_TEST_DATA) + "/golden/qwen3_5_moe_text-a"),
                                  EngineOptions{"cpu", 512, 64});
  }
  std::shared_ptr<const Snapshot> snap(const std::vector<int32_t>& toks) {
    Session s(*engine);
    s.prefill(toks, nullptr);
    return std::make_shared<Snapshot>(s.snapshot());
  }
  std::unique_ptr<Engine> engine;
};

TEST_F(PromptCacheTest, LongestPrefixWins) {
  PromptCache c(size_t(64) << 20);
  c.insert(snap({1, 2, 3}));
  c.insert(snap({1, 2, 3, 4, 5}));
  c.insert(snap({1, 2, 9}));
  auto h = c.lookup(std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(h);
  EXPECT_EQ(h->tokens, (std::vector<int32_t>{1, 2, 3, 4, 5}));
  h = c.lookup(std::vector<int32_t>{1, 2, 3, 4});
  ASSERT_TRUE(h);
  EXPECT_EQ(h->tokens.size(), 3u);
  h = c.lookup(std::vector<int32_t>{1, 2, 3});  // an exact match is usable (its logits are kept)
  ASSERT_TRUE(h);
  EXPECT_EQ(h->tokens.size(), 3u);
  EXPECT_FALSE(c.lookup(std::vector<int32_t>{1, 2}));  // a longer state cannot be cut back
  EXPECT_FALSE(c.lookup(std::vector<int32_t>{7}));
  auto st = c.stats();
  EXPECT_EQ(st.hits, 3u);
  EXPECT_EQ(st.misses, 2u);
  EXPECT_EQ(st.entries, 3u);
}

TEST_F(PromptCacheTest, RestoredStateContinuesLikeAFreshPrefill) {
  PromptCache c(size_t(64) << 20);
  std::vector<int32_t> all = {5, 17, 33, 2, 250, 101, 7, 7, 64, 3, 11, 300};
  c.insert(snap({5, 17, 33, 2, 250}));
  auto h = c.lookup(all);
  ASSERT_TRUE(h);
  Session a(*engine), b(*engine);
  a.restore(*h);
  std::vector<float> la(size_t(engine->config().vocab)), lb(la.size());
  a.prefill(std::span<const int32_t>(all).subspan(h->tokens.size()), la.data());
  b.prefill(all, lb.data());
  float md = 0;
  for (size_t i = 0; i < la.size(); ++i) md = std::max(md, std::fabs(la[i] - lb[i]));
  EXPECT_LT(md, 1e-3f);
}

TEST_F(PromptCacheTest, MemoryCapEvictsLeastRecentlyUsed) {
  auto s1 = snap({1, 2, 3, 4});
  size_t one = PromptCache::entry_bytes(*s1);
  PromptCache c(one * 2 + one / 2);  // room for two entries
  c.insert(s1);
  c.insert(snap({5, 6, 7, 8}));
  ASSERT_TRUE(c.lookup(std::vector<int32_t>{1, 2, 3, 4, 0}));  // touch the first
  c.insert(snap({9, 10, 11, 12}));                               // evicts {5,6,7,8}
  EXPECT_TRUE(c.lookup(std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_FALSE(c.lookup(std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_TRUE(c.lookup(std::vector<int32_t>{9, 10, 11, 12}));
  auto st = c.stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_LE(st.bytes, c.max_bytes());
  // An entry larger than the whole cap is not kept; re-inserting the same tokens replaces.
  PromptCache tiny(one / 2);
  tiny.insert(s1);
  EXPECT_EQ(tiny.stats().entries, 0u);
  c.insert(snap({9, 10, 11, 12}));
  EXPECT_EQ(c.stats().entries, 2u);
}

}  // namespace
}  // namespace lily::server
