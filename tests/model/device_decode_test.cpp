// The runtime side of on-device decoding, on the CPU: runtime::generate takes Backend::decode_on_device
// when a backend offers it, with the same emitted tokens and finish reasons as the host loop, and the
// session ends exactly after the absorbed tokens. The backend here is the CPU backend plus a host
// implementation of the decode_on_device contract (backend/backend.h), drawing with the host Sampler so
// its tokens must equal the host loop's. Also Sampler::distribution against sample().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/mapped_file.h"
#include "model/qwen_hybrid.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "../support/contract_backend.h"
#include "test_util.h"

using namespace lily;

namespace {

using lily::test_support::ContractBackend;

struct Fixture {
  std::shared_ptr<const ModelWeights> w;
  std::unique_ptr<Engine> host, dev;
  ContractBackend* contract = nullptr;
  std::vector<int32_t> prompt;
};

Fixture open(const std::string& dir) {
  Fixture f;
  EngineOptions eo;
  eo.ctx_size = 128;
  f.w = ModelWeights::load(dir);
  f.host = Engine::from_weights(f.w, eo);
  auto be = std::make_unique<ContractBackend>(f.w);
  f.contract = be.get();
  f.dev = Engine::from_backend(f.w, std::move(be), eo);
  auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
  auto ids = j["prompt_ids"].get<std::vector<int32_t>>();
  f.prompt.assign(ids.begin(), ids.begin() + 24);
  return f;
}

struct Outcome {
  GenerateResult r;
  std::vector<int32_t> seen, session_tokens;
  std::vector<float> last_logits;
  bool logits_given = false;
};

Outcome run(Engine& e, const std::vector<int32_t>& prompt, const GenerateOptions& go, int stop_after = -1, int64_t ctx = 0) {
  Session s(e, ctx);
  Outcome o;
  o.r = generate(s, prompt, go, [&](int32_t t, std::span<const float> logits) {
    o.seen.push_back(t);
    o.logits_given = !logits.empty();
    return stop_after < 0 || int(o.seen.size()) < stop_after;
  });
  o.session_tokens = s.tokens();
  o.last_logits = s.last_logits();
  return o;
}

// Logits after the prompt (one prefill) and then `gen` one decode step each: the steps both paths run.
std::vector<float> logits_after(Engine& e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& all) {
  Session s(e);
  std::vector<float> l(size_t(e.config().vocab));
  s.prefill(prompt, l.data());
  for (size_t i = prompt.size(); i < all.size(); ++i) s.decode(all[i], l.data());
  return l;
}

TEST(DeviceDecode, GenerateTakesTheDevicePathWithTheHostSemantics) {
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  if (dir.empty()) GTEST_SKIP() << "golden model not present";
  Fixture f = open(dir);
  const auto& P = f.prompt;

  GenerateOptions greedy;
  greedy.max_tokens = 10;
  GenerateOptions sampled = greedy;
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.top_k = 20;
  sampled.sampling.top_p = 0.9f;
  sampled.sampling.repetition_penalty = 1.2f;
  sampled.penalize_prompt = true;
  sampled.sampling.seed = 7;
  const Outcome ref = run(*f.host, P, greedy);
  ASSERT_EQ(ref.r.tokens.size(), 10u);
  const int32_t stop = ref.r.tokens[4];

  struct Variant {
    std::string name;
    GenerateOptions go;
    int stop_after = -1;
    int64_t ctx = 0;
  };
  std::vector<Variant> vs = {{"greedy", greedy}, {"sampled", sampled}, {"callback stop", greedy, 3}, {"max 1", greedy},
                             {"stop id", greedy}, {"context full", sampled, -1, int64_t(P.size()) + 3}};
  vs[3].go.max_tokens = 1;
  vs[4].go.stop_ids = {stop};
  for (const Variant& v : vs) {
    SCOPED_TRACE(v.name);
    const int before = f.contract->calls;
    const Outcome h = run(*f.host, P, v.go, v.stop_after, v.ctx);
    const Outcome d = run(*f.dev, P, v.go, v.stop_after, v.ctx);
    EXPECT_EQ(f.contract->calls, before + 1) << "the device path was taken";
    EXPECT_EQ(d.r.tokens, h.r.tokens);
    EXPECT_EQ(d.seen, h.seen);
    EXPECT_EQ(d.r.finish_reason, h.r.finish_reason);
    EXPECT_FALSE(d.logits_given) << "no logits on the device path";
    EXPECT_TRUE(h.logits_given);
    ASSERT_FALSE(h.r.tokens.empty());
    // host: all but the last emitted token absorbed; device: all that fit
    const bool full = v.ctx > 0 && int64_t(P.size() + h.r.tokens.size()) > v.ctx;
    const size_t absorbed = full ? size_t(v.ctx) - P.size() : d.r.tokens.size();
    std::vector<int32_t> want_h = P, want_d = P;
    want_h.insert(want_h.end(), h.r.tokens.begin(), h.r.tokens.end() - 1);
    want_d.insert(want_d.end(), d.r.tokens.begin(), d.r.tokens.begin() + std::ptrdiff_t(absorbed));
    EXPECT_EQ(h.session_tokens, want_h);
    EXPECT_EQ(d.session_tokens, want_d);
    EXPECT_EQ(d.last_logits, logits_after(*f.host, P, want_d)) << "the device session's logits follow its last token";
  }
  EXPECT_EQ(run(*f.dev, P, vs[4].go).r.finish_reason, "stop");
  EXPECT_EQ(run(*f.dev, P, vs[5].go, -1, vs[5].ctx).r.finish_reason, "length");

  // need_logits and allow_device = false keep the host loop
  const int before = f.contract->calls;
  GenerateOptions nl = greedy;
  nl.need_logits = true;
  Outcome o = run(*f.dev, P, nl);
  EXPECT_TRUE(o.logits_given);
  EXPECT_EQ(o.r.tokens, ref.r.tokens);
  GenerateOptions off = greedy;
  off.allow_device = false;
  EXPECT_EQ(run(*f.dev, P, off).r.tokens, ref.r.tokens);
  EXPECT_EQ(f.contract->calls, before);
}

TEST(DeviceDecode, SamplerDistributionIsWhatSampleDrawsFrom) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f, 2.0f};
  SamplingParams p;
  auto g = Sampler(p).distribution(logits);  // greedy: the first of the tied maxima
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].first, 1);
  EXPECT_EQ(g[0].second, 1.0);
  p.temperature = 1.0f;
  p.top_k = 3;  // ids 1, 5 (tie, lower id first), 2
  p.seed = 3;
  auto d = Sampler(p).distribution(logits);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].first, 1);
  EXPECT_EQ(d[1].first, 5);
  EXPECT_EQ(d[2].first, 2);
  const double e = std::exp(double(1.9f - 2.0f)), z = 2 + e;  // the host's float difference
  EXPECT_NEAR(d[0].second, 1 / z, 1e-12);
  EXPECT_NEAR(d[2].second, e / z, 1e-12);
  p.top_p = 0.5f;  // 1/z = 0.3486 < 0.5 <= 2/z: ids 1 and 5
  auto tp = Sampler(p).distribution(logits);
  ASSERT_EQ(tp.size(), 2u);
  EXPECT_NEAR(tp[0].second, 0.5, 1e-12);
  // sample() draws from exactly that set, at those frequencies
  Sampler s(p);
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(logits);
    ASSERT_TRUE(t == 1 || t == 5);
    ones += t == 1;
  }
  EXPECT_NEAR(double(ones) / n, 0.5, 0.04);
}

}  // namespace
