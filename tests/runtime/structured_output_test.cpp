// Structured outputs through the scheduler on the demo model (random weights, the real Qwen3 tokenizer):
// 200 sampled completions against 20 JSON schemas, each a complete document that parses and that ajv
// (a real JSON Schema validator, from npm) validates against its schema. And the device-sampled path (an
// emulated device sampler, the mask uploaded per step) draws the same constrained tokens as the host path.
// And speculative decoding under a grammar: a drafted token the grammar forbids ends the accepted prefix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../support/recording_job.h"
#include "../support/run_command.h"
#include "../support/sampling_backend.h"
#include "runtime/demo_model.h"
#include "runtime/drafter.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/grammar_constraint.h"
#include "runtime/loop.h"
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

// The narrow demo on the host path and on the emulated device sampler, with the tokenizer's vocabulary.
struct TwoPaths {
  std::shared_ptr<const text::Tokenizer> tok;
  std::unique_ptr<Engine> host, dev;
  test_support::SamplingCpuBackend* sampler = nullptr;
  std::shared_ptr<const text::TokenVocabulary> vocab;
  std::vector<int32_t> prompt;  // a chat turn asking for JSON
};
TwoPaths two_paths(const std::string& dir) {
  TwoPaths t;
  t.tok = text::Tokenizer::load(dir);
  std::shared_ptr<const ModelWeights> w = narrow_demo(*t.tok);
  EngineOptions eo{"cpu", 256, 256};
  t.host = Engine::from_weights(w, eo);
  auto be = std::make_unique<test_support::SamplingCpuBackend>(w);
  t.sampler = be.get();
  t.dev = Engine::from_backend(w, std::move(be), eo);
  t.vocab = text::TokenVocabulary::from_tokenizer(*t.tok, int32_t(t.host->config().vocab));
  t.prompt = t.tok->encode("<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n");
  return t;
}

TEST(StructuredOutput, DeviceSamplerPathDrawsUnderTheMask) {
  const std::string dir = find_demo_tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  TwoPaths t = two_paths(dir);
  const json schemas = load_schemas();
  constexpr int64_t kMaxTokens = 48;  // tight: the budgeted masks are exercised too
  for (size_t i : {size_t(0), size_t(7), size_t(17), size_t(19)}) {
    auto g = std::make_shared<text::TokenGrammar>(text::json_schema_grammar(schemas[i], "schema"), t.vocab, t.tok->stop_ids());
    for (uint64_t seed : {1, 2}) {
      GenerateOptions o;
      o.max_tokens = kMaxTokens;
      o.sampling.temperature = 1.0f;
      o.sampling.top_k = 40;
      o.sampling.seed = seed;
      o.stop_ids = t.tok->stop_ids();
      o.sample_vocab = t.tok->vocab_size();
      o.use_cache = false;
      o.constraint = std::make_shared<GrammarConstraint>(g, kMaxTokens);
      Session hs(*t.host);
      const GenerateResult a = generate(hs, t.prompt, o);
      o.constraint = std::make_shared<GrammarConstraint>(g, kMaxTokens);
      const int64_t draws = t.sampler->draws;
      Session ds(*t.dev);
      const GenerateResult b = generate(ds, t.prompt, o);
      EXPECT_FALSE(a.device_sampled);
      EXPECT_TRUE(b.device_sampled);
      EXPECT_EQ(t.sampler->draws - draws, int64_t(b.tokens.size()));
      EXPECT_EQ(a.tokens, b.tokens) << "schema " << i << " seed " << seed;
      std::vector<int32_t> ids = b.tokens;
      if (!ids.empty() && std::find(o.stop_ids.begin(), o.stop_ids.end(), ids.back()) != o.stop_ids.end()) ids.pop_back();
      const std::string text = t.tok->decode(ids);
      EXPECT_TRUE(json::accept(text)) << "schema " << i << " seed " << seed << ": " << text;
    }
  }
}

// Records each token and the argmax of the unmasked logits row it was drawn from (host draws).
class ArgmaxJob : public test_support::RecordingJob {
 public:
  using RecordingJob::RecordingJob;
  bool on_token(int32_t t, std::span<const float> logits) override {
    raw_argmax.push_back(logits.empty() ? -1 : int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    return RecordingJob::on_token(t, logits);
  }
  std::vector<int32_t> raw_argmax;
};

// Drafts, at output position g + i of a round: the reference continuation's token for i < good, then
// at i == good the token `poison(g + i)` proposes (one the grammar forbids there), then the reference
// again. Records the first poisoned index of each round with the verification's outcome.
class PoisonDrafter final : public Drafter {
 public:
  PoisonDrafter(size_t prompt_len, std::vector<int32_t> truth, std::vector<int> schedule, std::function<int32_t(size_t)> poison)
      : prompt_len_(prompt_len), truth_(std::move(truth)), schedule_(std::move(schedule)), poison_(std::move(poison)) {}
  std::string name() const override { return "poison"; }
  void begin(const DraftRequest& r) override {
    const size_t g = r.tokens.size() - prompt_len_;
    const int good = schedule_[rounds_++ % schedule_.size()];
    d_ = {};
    poisoned_at_ = r.k;
    for (int i = 0; i < r.k && g + size_t(i) < truth_.size(); ++i) {
      if (i == good) {
        d_.tokens.push_back(poison_(g + size_t(i)));
        poisoned_at_ = i;
      } else {
        d_.tokens.push_back(truth_[g + size_t(i)]);
      }
    }
  }
  Draft draft(SequenceState&) override { return std::move(d_); }
  void verified(int drafted, int accepted) override { outcomes.push_back({drafted, accepted, poisoned_at_}); }

  struct Outcome {
    int drafted, accepted, poisoned_at;  // poisoned_at == drafted: no forbidden token in the draft
  };
  std::vector<Outcome> outcomes;

 private:
  size_t prompt_len_;
  std::vector<int32_t> truth_;
  std::vector<int> schedule_;
  std::function<int32_t(size_t)> poison_;
  size_t rounds_ = 0;
  int poisoned_at_ = 0;
  Draft d_;
};

GenResult run_loop(Engine& e, std::shared_ptr<test_support::RecordingJob> job) {
  Session s(e);
  GenerationLoop loop(e, LoopOptions{});
  loop.add(job, s, 0);
  while (!loop.empty()) loop.step();
  return job->wait();
}

// Speculative decoding under a JSON-schema grammar, on the host path and the emulated device sampler
// (a constrained request verifies on the host there). Greedy: drafts hold the unconstrained model's own
// argmax where the grammar forbids it, a token that verification without the mask would accept; every
// such draft is rejected, the drafts before it are accepted, and the output is the constrained plain
// output. Sampled: forbidden drafts are never accepted and every output is a complete document.
TEST(StructuredOutput, SpeculativeDraftsAreCheckedAgainstTheGrammar) {
  const std::string dir = find_demo_tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  TwoPaths t = two_paths(dir);
  const json schemas = load_schemas();
  constexpr int64_t kMaxTokens = 40;
  for (size_t si : {size_t(0), size_t(4), size_t(14)}) {
    SCOPED_TRACE(fmt::format("schema {}", si));
    auto g = std::make_shared<text::TokenGrammar>(text::json_schema_grammar(schemas[si], "schema"), t.vocab, t.tok->stop_ids());
    GenParams base;
    base.prompt = t.prompt;
    base.max_tokens = kMaxTokens;
    base.stop_ids = t.tok->stop_ids();
    base.sample_vocab = t.tok->vocab_size();
    base.use_cache = false;
    auto constrained = [&](GenParams p) {
      p.constraint = std::make_shared<GrammarConstraint>(g, kMaxTokens);
      return p;
    };
    // The greedy constrained reference, the raw argmax at each position and what the grammar allows there.
    auto ref = std::make_shared<ArgmaxJob>(constrained(base));
    const GenResult rr = run_loop(*t.host, ref);
    ASSERT_NE(rr.finish_reason, "error") << rr.error;
    std::vector<int32_t> truth = ref->ids;
    if (rr.stop_token >= 0) truth.push_back(rr.stop_token);
    // A token the grammar forbids at position j: the raw argmax when it is forbidden, else the byte 0x01
    // (a control character: never part of a JSON document, inside strings or out).
    const auto ctl = t.tok->encode(std::string(1, '\x01'));
    ASSERT_EQ(ctl.size(), 1u);
    const int32_t stray = ctl[0];
    std::vector<bool> forbidden_argmax;
    GrammarConstraint walk(g, kMaxTokens);
    for (size_t i = 0; i < truth.size(); ++i) {
      const auto m = walk.allowed();
      auto allowed = [&](int32_t id) { return (m[size_t(id) >> 6] >> (id & 63) & 1) != 0; };
      ASSERT_TRUE(allowed(truth[i]));
      forbidden_argmax.push_back(i < ref->raw_argmax.size() && !allowed(ref->raw_argmax[i]));
      ASSERT_FALSE(allowed(stray)) << "at " << i;
      walk.accept(truth[i]);
    }
    const int forbidden_positions = int(std::count(forbidden_argmax.begin(), forbidden_argmax.end(), true));
    ASSERT_GE(forbidden_positions, int(truth.size()) / 4) << "the random model's own choice is often not JSON";
    auto poison = [&](size_t j) { return j < forbidden_argmax.size() && forbidden_argmax[j] ? ref->raw_argmax[j] : stray; };

    for (Engine* e : {t.host.get(), t.dev.get()}) {
      SCOPED_TRACE(e->backend().name());
      for (int depth : {1, 3, 5}) {
        std::vector<int> schedule;
        for (int a = 0; a <= depth; ++a) schedule.push_back(a);
        auto d = std::make_shared<PoisonDrafter>(t.prompt.size(), truth, schedule, poison);
        GenParams p = constrained(base);
        p.spec.drafter = d;
        p.spec.depth = depth;
        auto job = std::make_shared<test_support::RecordingJob>(p);
        const GenResult r = run_loop(*e, job);
        ASSERT_NE(r.finish_reason, "error") << r.error;
        std::vector<int32_t> got = job->ids;
        if (r.stop_token >= 0) got.push_back(r.stop_token);
        EXPECT_EQ(got, truth) << "depth " << depth;
        int poisoned = 0, accepted = 0;
        for (const auto& o : d->outcomes) {
          accepted += o.accepted;
          if (o.poisoned_at < o.drafted) {
            ++poisoned;
            EXPECT_EQ(o.accepted, o.poisoned_at) << "depth " << depth << ": the drafts before the forbidden one are the "
                                                 << "reference's, the forbidden one ends the prefix";
          } else {
            EXPECT_LE(o.accepted, o.drafted);
          }
        }
        EXPECT_GT(poisoned, 0) << "depth " << depth;
        EXPECT_GT(accepted, 0) << "depth " << depth;
        EXPECT_EQ(r.spec.rounds, int64_t(d->outcomes.size()));
      }
      // Sampled: every draft is a forbidden token (at offset 0 or after one reference token, which the
      // sampled output need not follow); none is ever accepted at its position.
      for (uint64_t seed : {1, 2, 3}) {
        GenParams p = constrained(base);
        p.sampling.temperature = 1.0f;
        p.sampling.top_k = 40;
        p.sampling.seed = seed;
        auto d = std::make_shared<PoisonDrafter>(t.prompt.size(), std::vector<int32_t>(kMaxTokens + 1, stray), std::vector<int>{0},
                                                 [&](size_t) { return stray; });
        p.spec.drafter = d;
        p.spec.depth = 2;
        auto job = std::make_shared<test_support::RecordingJob>(p);
        const GenResult r = run_loop(*e, job);
        ASSERT_NE(r.finish_reason, "error") << r.error;
        ASSERT_FALSE(d->outcomes.empty());
        for (const auto& o : d->outcomes) EXPECT_EQ(o.accepted, 0) << "seed " << seed;
        const std::string text = t.tok->decode(job->ids);
        EXPECT_TRUE(json::accept(text)) << "seed " << seed << ": " << text;
      }
    }
  }
}

}  // namespace
}  // namespace lily
