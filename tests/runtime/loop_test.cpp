// The generation loop (runtime/loop.h) on the CPU: the device-sampled, pipelined path (through a CPU
// backend with an emulated device sampler, tests/support/sampling_backend.h) emits the same tokens and
// leaves the same end state as the host path; requests stepped together give what each gives alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "../support/recording_job.h"
#include "../support/sampling_backend.h"
#include "core/mapped_file.h"
#include "runtime/generate.h"
#include "runtime/loop.h"
#include "runtime/session.h"

using namespace lily;

namespace {

struct Fixture {
  std::shared_ptr<const ModelWeights> w;
  std::unique_ptr<Engine> host, dev;
  test_support::SamplingCpuBackend* sampler = nullptr;
  std::vector<int32_t> prompt;
};

Fixture open(const std::string& name) {
  Fixture f;
  const std::string dir = test::golden_dir(name);
  EngineOptions eo;
  eo.ctx_size = 128;
  f.w = ModelWeights::load(dir);
  f.host = Engine::from_weights(f.w, eo);
  auto be = std::make_unique<test_support::SamplingCpuBackend>(f.w);
  f.sampler = be.get();
  f.dev = Engine::from_backend(f.w, std::move(be), eo);
  auto ids = nlohmann::json::parse(read_text_file(dir + "/golden.json"))["prompt_ids"].get<std::vector<int32_t>>();
  f.prompt.assign(ids.begin(), ids.begin() + 24);
  return f;
}

constexpr int32_t kProbe = 7;  // a token decoded after the run: its logits show what the state holds

struct Outcome {
  GenerateResult r;
  std::vector<int32_t> seen, session_tokens;
  bool logits_given = false;
  std::vector<float> probe_logits;  // after decoding kProbe on the session (empty when its context is full)
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
  if (s.n_tokens() < s.capacity()) {
    o.probe_logits.resize(size_t(e.config().vocab));
    s.decode(kProbe, o.probe_logits.data());
  }
  return o;
}

// The logits after prompt + gen + kProbe on a fresh session of `e`.
std::vector<float> probe_reference(Engine& e, const std::vector<int32_t>& prompt, std::vector<int32_t> gen) {
  Session s(e);
  std::vector<float> l(size_t(e.config().vocab));
  gen.push_back(kProbe);
  s.prefill(prompt, l.data());
  for (int32_t t : gen) s.decode(t, l.data());
  return l;
}

TEST(Loop, DevicePathMatchesTheHostPathAndEndState) {
  Fixture f = open("qwen3_5_moe_text-a");
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
  GenerateOptions biased = sampled;
  biased.logit_bias = {{3, 4.0f}, {5, -100.0f}};
  biased.sample_vocab = 200;
  const Outcome ref = run(*f.host, P, greedy);
  ASSERT_EQ(ref.r.tokens.size(), 10u);
  const int32_t stop = ref.r.tokens[4];

  struct Variant {
    std::string name;
    GenerateOptions go;
    int stop_after = -1;
    int64_t ctx = 0;
  };
  std::vector<Variant> vs = {{"greedy", greedy},           {"sampled", sampled},       {"bias and vocab limit", biased},
                             {"callback stop", greedy, 3}, {"max 1", greedy},          {"stop id", greedy},
                             {"context full", sampled, -1, int64_t(P.size()) + 3}, {"max 0", greedy}};
  vs[4].go.max_tokens = 1;
  vs[5].go.stop_ids = {stop};
  vs[7].go.max_tokens = 0;
  for (const Variant& v : vs) {
    SCOPED_TRACE(v.name);
    const int64_t before = f.sampler->draws;
    const Outcome h = run(*f.host, P, v.go, v.stop_after, v.ctx);
    const Outcome d = run(*f.dev, P, v.go, v.stop_after, v.ctx);
    if (v.go.max_tokens > 0) {
      EXPECT_GT(f.sampler->draws, before) << "the device sampler drew";
      EXPECT_TRUE(d.r.device_sampled);
      EXPECT_TRUE(h.logits_given);
      EXPECT_FALSE(d.logits_given) << "no logits on the device path";
    }
    EXPECT_FALSE(h.r.device_sampled);
    EXPECT_EQ(d.r.tokens, h.r.tokens);
    EXPECT_EQ(d.seen, h.seen);
    EXPECT_EQ(d.r.finish_reason, h.r.finish_reason);
    // both paths: the prompt and every emitted token that fits
    const size_t fit = v.ctx > 0 ? std::min(h.r.tokens.size(), size_t(v.ctx) - P.size()) : h.r.tokens.size();
    std::vector<int32_t> want = P;
    want.insert(want.end(), h.r.tokens.begin(), h.r.tokens.begin() + std::ptrdiff_t(fit));
    EXPECT_EQ(h.session_tokens, want);
    EXPECT_EQ(d.session_tokens, want);
    // ... in their states too: one more token gives a fresh session's logits
    const bool room = v.ctx == 0 || int64_t(want.size()) < v.ctx;
    ASSERT_EQ(h.probe_logits.empty(), !room);
    ASSERT_EQ(d.probe_logits.empty(), !room);
    if (room) {
      const auto ref = probe_reference(*f.host, P, std::vector<int32_t>(want.begin() + std::ptrdiff_t(P.size()), want.end()));
      for (const Outcome* o : {&h, &d}) {
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, double(std::abs(o->probe_logits[i] - ref[i])));
        EXPECT_LT(worst, 1e-4) << (o == &h ? "host" : "device") << " path: the state holds exactly the absorbed tokens";
      }
    }
  }
  EXPECT_EQ(run(*f.dev, P, vs[5].go).r.finish_reason, "stop");
  EXPECT_EQ(run(*f.dev, P, vs[6].go, -1, vs[6].ctx).r.finish_reason, "length");
  for (int32_t t : run(*f.dev, P, biased).r.tokens) {
    EXPECT_LT(t, 200);
    EXPECT_NE(t, 5);
  }

  // token_logits and allow_device = false keep the host sampler
  const int64_t before = f.sampler->draws;
  GenerateOptions nl = greedy;
  nl.token_logits = true;
  Outcome o = run(*f.dev, P, nl);
  EXPECT_TRUE(o.logits_given);
  EXPECT_EQ(o.r.tokens, ref.r.tokens);
  GenerateOptions off = greedy;
  off.allow_device = false;
  EXPECT_EQ(run(*f.dev, P, off).r.tokens, ref.r.tokens);
  EXPECT_EQ(f.sampler->draws, before);
}

// A session holding a prefix (and the logits after it) continues: the prompt may even be empty.
TEST(Loop, ContinuesASessionAndItsLogits) {
  Fixture f = open("qwen3_next-a");
  GenerateOptions go;
  go.max_tokens = 6;
  for (Engine* e : {f.host.get(), f.dev.get()}) {
    Session whole(*e), split(*e);
    const auto a = generate(whole, f.prompt, go);
    std::vector<int32_t> head(f.prompt.begin(), f.prompt.begin() + 10), tail(f.prompt.begin() + 10, f.prompt.end());
    std::vector<float> l(static_cast<size_t>(e->config().vocab));
    split.prefill(head, l.data());
    const auto b = generate(split, tail, go);
    EXPECT_EQ(a.tokens, b.tokens);
    Session again(*e);
    again.prefill(f.prompt, l.data());
    EXPECT_EQ(generate(again, {}, go).tokens, a.tokens);
  }
}

// Several requests in one loop (continuous batching): each gets the tokens it gets alone, greedy and
// seeded sampling, on both paths; the steps held several requests' rows.
TEST(Loop, RequestsSteppedTogetherGetTheirSoloTokens) {
  Fixture f = open("qwen3_5_moe_text-a");
  for (Engine* e : {f.host.get(), f.dev.get()}) {
    const int S = 7;
    std::vector<GenParams> ps;
    for (int i = 0; i < S; ++i) {
      GenParams p;
      p.prompt.assign(f.prompt.begin() + i, f.prompt.begin() + 10 + 2 * i);
      p.max_tokens = 4 + i;
      if (i % 2) {
        p.sampling.temperature = 0.8f;
        p.sampling.top_p = 0.9f;
        p.sampling.seed = uint64_t(100 + i);
      }
      ps.push_back(p);
    }
    std::vector<std::vector<int32_t>> solo;
    for (auto& p : ps) {
      Session s(*e);
      solo.push_back(generate(s, p.prompt, p).tokens);
    }
    LoopOptions lo;
    lo.step_tokens = 12;  // prompts are chunked into the decode steps
    const auto run = test_support::run_together(*e, ps, lo);
    for (int i = 0; i < S; ++i) {
      EXPECT_EQ(run.jobs[size_t(i)]->ids, solo[size_t(i)]) << e->backend().name() << " request " << i;
      EXPECT_EQ(run.jobs[size_t(i)]->wait().finish_reason, "length");
    }
    EXPECT_LT(run.steps, 30) << "requests shared steps";
  }
}

// Cancellation mid-generation ends the request within a step, on both paths.
TEST(Loop, CancelEndsWithinAStep) {
  Fixture f = open("qwen3_5_moe_text-a");
  for (Engine* e : {f.host.get(), f.dev.get()}) {
    GenParams p;
    p.prompt = f.prompt;
    p.max_tokens = 50;
    struct CancellingJob : test_support::RecordingJob {
      using RecordingJob::RecordingJob;
      bool on_token(int32_t t, std::span<const float> l) override {
        RecordingJob::on_token(t, l);
        if (ids.size() == 3) cancel();
        return true;
      }
    };
    auto job = std::make_shared<CancellingJob>(p);
    Session s(*e);
    GenerationLoop loop(*e, LoopOptions{});
    loop.add(job, s, 0);
    int steps = 0;
    while (!loop.empty()) {
      loop.step();
      ++steps;
    }
    EXPECT_EQ(job->wait().finish_reason, "cancelled");
    EXPECT_LE(job->ids.size(), 5u);
    EXPECT_LE(steps, 8);
  }
}

}  // namespace
