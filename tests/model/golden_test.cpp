// The engine against HF transformers' float32 reference (tests/data/golden, ../shared/golden).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lily;

namespace {

struct Golden {
  std::vector<int32_t> prompt, greedy;
  int64_t greedy_prompt_len = 0;
  std::vector<float> logits;  // [T, V]
};

Golden read_golden(const std::string& dir) {
  Golden g;
  auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
  g.prompt = j["prompt_ids"].get<std::vector<int32_t>>();
  g.greedy = j["greedy_ids"].get<std::vector<int32_t>>();
  g.greedy_prompt_len = j["greedy_prompt_len"].get<int64_t>();
  g.logits = test::read_f32(dir + "/golden_logits.f32");
  return g;
}

class GoldenModel : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return test::golden_dir(GetParam()); }
};

std::vector<float> teacher_forced(const std::string& dir, int64_t chunk, const std::vector<int32_t>& ids) {
  EngineOptions eo;
  eo.prefill_chunk = chunk;
  eo.ctx_size = int64_t(ids.size());
  auto e = Engine::open(dir, eo);
  Session s(*e);
  std::vector<float> out(ids.size() * size_t(e->config().vocab));
  s.prefill(ids, nullptr, out.data());
  return out;
}

// Every prefill chunking (one step; one token per step; chunks that split the 64-row delta-rule chunks
// unevenly; the whole prompt as one chunk) against HF: max |Δ| / RMS under 1e-3, argmax on every row.
TEST_P(GoldenModel, LogitsMatchReference) {
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not present";
  auto g = read_golden(dir());
  for (int64_t chunk : {2048, 1, 7, 150}) {
    auto ours = teacher_forced(dir(), chunk, g.prompt);
    ASSERT_EQ(ours.size(), g.logits.size());
    const int64_t T = int64_t(g.prompt.size()), V = int64_t(ours.size()) / T;
    double ss = 0, maxd = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      ss += double(g.logits[i]) * g.logits[i];
      maxd = std::max(maxd, double(std::fabs(ours[i] - g.logits[i])));
    }
    const double rms = std::sqrt(ss / double(ours.size()));
    EXPECT_LE(maxd, 1e-3 * rms) << "prefill chunk " << chunk << ": max |dlogit| " << maxd << " rms " << rms;
    for (int64_t t = 0; t < T; ++t)
      EXPECT_EQ(test::argmax(ours.data() + t * V, V), test::argmax(g.logits.data() + t * V, V))
          << "prefill chunk " << chunk << " row " << t;
    std::printf("%s, prefill chunk %lld: max |dlogit| / RMS = %.2e\n", GetParam().c_str(), (long long)chunk, maxd / rms);
  }
}

TEST_P(GoldenModel, PrefillChunkSizesAgree) {
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not present";
  auto g = read_golden(dir());
  auto whole = teacher_forced(dir(), 2048, g.prompt);
  for (int64_t chunk : {1, 7, 64, 150}) {
    auto part = teacher_forced(dir(), chunk, g.prompt);
    double maxd = 0;
    for (size_t i = 0; i < whole.size(); ++i) maxd = std::max(maxd, double(std::fabs(whole[i] - part[i])));
    EXPECT_LE(maxd, 1e-4) << "prefill chunk " << chunk;
  }
}

TEST_P(GoldenModel, GreedyContinuationMatches) {
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not present";
  auto g = read_golden(dir());
  for (int64_t chunk : {1, 7, 150}) {
    EngineOptions eo;
    eo.ctx_size = 256;
    eo.prefill_chunk = chunk;
    auto e = Engine::open(dir(), eo);
    Session s(*e);
    GenerateOptions go;
    go.max_tokens = int64_t(g.greedy.size());
    std::vector<int32_t> prompt(g.prompt.begin(), g.prompt.begin() + g.greedy_prompt_len);
    auto res = generate(s, prompt, go);
    EXPECT_EQ(res.tokens, g.greedy) << "prefill chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenModel,
                         ::testing::Values("qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_moe_text-r",
                                           "qwen3_5_moe_text-a-mtp", "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"),
                         test::ModelParamName());

}  // namespace
