// Structured outputs through the scheduler on the demo model (random weights, the real Qwen3 tokenizer):
// 200 sampled completions against 20 JSON schemas, each a complete document that parses and that ajv
// (a real JSON Schema validator, from npm) validates against its schema. And the device-sampled path (an
// emulated device sampler, the mask uploaded per step) draws the same constrained tokens as the host path.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../support/recording_job.h"
#include "../support/run_command.h"
#include "../support/sampling_backend.h"
#include "runtime/generate.h"
#include "runtime/demo_model.h"
#include "runtime/engine.h"
#include "runtime/grammar_constraint.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "text/json_grammar.h"
#include "text/token_grammar.h"
#include "text/tokenizer.h"

namespace lily {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

using CollectJob = lily::test_support::RecordingJob;

using lily::test_support::run_command;

// The demo architecture, narrower: the 151K-row head dominates each step.
std::shared_ptr<ModelWeights> narrow_demo(const text::Tokenizer& tok) {
  DemoModelOptions d;
  d.vocab = tok.vocab_size();
  d.hidden = 64;
  return make_demo_weights(d);
}

json load_schemas() {
  std::ifstream f(fs::path(LILY_TEST_DATA) / "structured/schemas.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

TEST(StructuredOutput, TwoHundredDemoCompletionsValidate) {
  const std::string dir = find_demo_tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  auto tok = text::Tokenizer::load(dir);
  auto engine = Engine::from_weights(narrow_demo(*tok), EngineOptions{"cpu", 512, 256});
  auto vocab = text::TokenVocabulary::from_tokenizer(*tok, int32_t(engine->config().vocab));
  const json schemas = load_schemas();
  ASSERT_EQ(schemas.size(), 20u);

  SchedulerOptions so;
  so.max_queue = 256;
  Scheduler sched(*engine, so);
  const auto prompt = tok->encode("<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n");
  constexpr int kPerSchema = 10;
  constexpr int64_t kMaxTokens = 48;
  std::vector<std::pair<size_t, std::shared_ptr<CollectJob>>> jobs;
  for (size_t i = 0; i < schemas.size(); ++i) {
    auto g = std::make_shared<text::TokenGrammar>(text::json_schema_grammar(schemas[i], fmt::format("schemas[{}]", i)), vocab,
                                                  tok->stop_ids());
    for (int k = 0; k < kPerSchema; ++k) {
      GenParams p;
      p.prompt = prompt;
      p.max_tokens = kMaxTokens;
      p.sampling.temperature = 1.0f;
      p.sampling.top_k = 40;  // a full sort of 151K candidates per step would dominate the test
      p.sampling.seed = uint64_t(i * 100 + size_t(k));
      p.stop_ids = tok->stop_ids();
      p.sample_vocab = tok->vocab_size();
      p.constraint = std::make_shared<GrammarConstraint>(g, kMaxTokens);
      auto j = std::make_shared<CollectJob>(std::move(p));
      ASSERT_TRUE(sched.submit(j));
      jobs.emplace_back(i, j);
    }
  }
  json outputs = json::array();
  int stopped = 0;
  for (auto& [i, j] : jobs) {
    GenResult r = j->wait();
    ASSERT_NE(r.finish_reason, "error") << r.error;
    stopped += r.finish_reason == "stop";
    const std::string text = tok->decode(j->ids);
    EXPECT_TRUE(json::accept(text)) << "schema " << i << ": " << text;
    outputs.push_back({{"schema", i}, {"text", text}});
  }
  // Every document is complete: most end with the stop id, the rest exactly at max_tokens.
  EXPECT_GT(stopped, 100);
  const fs::path out = fs::path(LILY_BINARY_DIR) / "structured_outputs.json";
  std::ofstream(out) << json{{"schemas", schemas}, {"outputs", outputs}}.dump(1);
  const fs::path node_modules = fs::path(LILY_SOURCE_DIR) / "tests/server/node_modules/ajv/package.json";
  if (std::system("node --version > /dev/null 2>&1") != 0 || !fs::exists(node_modules))
    GTEST_SKIP() << "node or the ajv npm package is missing (scripts/fetch-assets.sh installs it); documents parse";
  std::string log;
  int rc = run_command(fmt::format("node '{}' '{}'", (fs::path(LILY_SOURCE_DIR) / "tests/runtime/validate_json.mjs").string(), out.string()), log);
  EXPECT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("200 valid, 0 invalid"), std::string::npos) << log;
}

TEST(StructuredOutput, DeviceSamplerPathDrawsUnderTheMask) {
  const std::string dir = find_demo_tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  auto tok = text::Tokenizer::load(dir);
  std::shared_ptr<const ModelWeights> w = narrow_demo(*tok);
  EngineOptions eo{"cpu", 256, 256};
  auto host = Engine::from_weights(w, eo);
  auto be = std::make_unique<test_support::SamplingCpuBackend>(w);
  auto* sampler = be.get();
  auto dev = Engine::from_backend(w, std::move(be), eo);
  auto vocab = text::TokenVocabulary::from_tokenizer(*tok, int32_t(host->config().vocab));
  const json schemas = load_schemas();
  const auto prompt = tok->encode("<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n");
  constexpr int64_t kMaxTokens = 48;  // tight: the budgeted masks are exercised too
  for (size_t i : {size_t(0), size_t(7), size_t(17), size_t(19)}) {
    auto g = std::make_shared<text::TokenGrammar>(text::json_schema_grammar(schemas[i], "schema"), vocab, tok->stop_ids());
    for (uint64_t seed : {1, 2}) {
      GenerateOptions o;
      o.max_tokens = kMaxTokens;
      o.sampling.temperature = 1.0f;
      o.sampling.top_k = 40;
      o.sampling.seed = seed;
      o.stop_ids = tok->stop_ids();
      o.sample_vocab = tok->vocab_size();
      o.use_cache = false;
      o.constraint = std::make_shared<GrammarConstraint>(g, kMaxTokens);
      Session hs(*host);
      const GenerateResult a = generate(hs, prompt, o);
      o.constraint = std::make_shared<GrammarConstraint>(g, kMaxTokens);
      const int64_t draws = sampler->draws;
      Session ds(*dev);
      const GenerateResult b = generate(ds, prompt, o);
      EXPECT_FALSE(a.device_sampled);
      EXPECT_TRUE(b.device_sampled);
      EXPECT_EQ(sampler->draws - draws, int64_t(b.tokens.size()));
      EXPECT_EQ(a.tokens, b.tokens) << "schema " << i << " seed " << seed;
      std::vector<int32_t> ids = b.tokens;
      if (!ids.empty() && std::find(o.stop_ids.begin(), o.stop_ids.end(), ids.back()) != o.stop_ids.end()) ids.pop_back();
      const std::string text = tok->decode(ids);
      EXPECT_TRUE(json::accept(text)) << "schema " << i << " seed " << seed << ": " << text;
    }
  }
}

}  // namespace
}  // namespace lily
