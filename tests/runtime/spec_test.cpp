// Speculative decoding in the generation loop (runtime/spec.h): greedy output with speculation equals
// plain greedy output on every golden model, for depths 1..6 and auto, with the MTP drafter, prompt
// lookup and a replay drafter that makes every accept count 0..k happen, on the host path and the
// device-sampled path; the end conditions inside a round leave the plain end state; several speculative
// streams in one loop get their solo tokens; bad input is refused naming its cause.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "../support/recording_job.h"
#include "../support/replay_drafter.h"
#include "../support/sampling_backend.h"
#include "backend/cpu/mtp_reference.h"
#include "core/mapped_file.h"
#include "runtime/generate.h"
#include "runtime/loop.h"
#include "runtime/session.h"

using namespace lily;

namespace {

const char* const kAll[] = {"qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_moe_text-r", "qwen3_5_moe_text-a-mtp",
                            "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"};

struct SpecModel {
  std::shared_ptr<const ModelWeights> w;
  std::unique_ptr<Engine> host, dev;
  std::vector<int32_t> prompt;
};

// Empty weights when the model is not present (qwen3_5_moe_text-r lives beside the repository).
SpecModel open_model(const std::string& name, size_t prompt_len = 40) {
  SpecModel m;
  const std::string dir = test::golden_dir(name);
  if (dir.empty()) return m;
  EngineOptions eo;
  eo.ctx_size = 160;
  m.w = ModelWeights::load(dir);
  m.host = Engine::from_weights(m.w, eo);
  m.dev = Engine::from_backend(m.w, std::make_unique<test_support::SamplingCpuBackend>(m.w), eo);
  auto ids = nlohmann::json::parse(read_text_file(dir + "/golden.json"))["prompt_ids"].get<std::vector<int32_t>>();
  m.prompt.assign(ids.begin(), ids.begin() + std::ptrdiff_t(prompt_len));
  // a repeated stretch, so that prompt lookup finds matches in the prompt as well as in the output
  m.prompt.insert(m.prompt.end(), ids.begin() + 5, ids.begin() + 17);
  return m;
}

struct SpecOutcome {
  GenerateResult r;
  std::vector<int32_t> session;
  SpecStats spec;
};

SpecOutcome run_spec(Engine& e, const std::vector<int32_t>& prompt, const GenParams& p, int stop_after = -1, int64_t ctx = 0) {
  Session s(e, ctx);
  auto job = std::make_shared<test_support::RecordingJob>(p);
  job->params.prompt = prompt;
  int seen = 0;
  job->hook = [&](int32_t) { return stop_after < 0 || ++seen < stop_after; };
  GenerationLoop loop(e, LoopOptions{});
  loop.add(job, s, 0);
  while (!loop.empty()) loop.step();
  const GenResult res = job->wait();
  EXPECT_NE(res.finish_reason, "error") << res.error;
  SpecOutcome o;
  o.r.tokens = job->ids;
  if (res.stop_token >= 0) o.r.tokens.push_back(res.stop_token);
  o.r.finish_reason = res.finish_reason;
  o.session = s.tokens();
  o.spec = res.spec;
  return o;
}

void expect_same(const SpecOutcome& a, const SpecOutcome& b, const std::string& what) {
  EXPECT_EQ(a.r.tokens, b.r.tokens) << what;
  EXPECT_EQ(a.r.finish_reason, b.r.finish_reason) << what;
  EXPECT_EQ(a.session, b.session) << what << ": end state";
}

TEST(Spec, GreedyEqualsPlainOnEveryGoldenModel) {
  int64_t ngram_rounds = 0;
  for (const char* name : kAll) {
    SCOPED_TRACE(name);
    SpecModel m = open_model(name);
    if (!m.w) continue;
    const bool has_mtp = m.w->mtp.has_value();
    GenParams plain;
    plain.max_tokens = 28;
    for (Engine* e : {m.host.get(), m.dev.get()}) {
      SCOPED_TRACE(e->backend().name());
      const SpecOutcome ref = run_spec(*e, m.prompt, plain);
      ASSERT_EQ(ref.r.tokens.size(), 28u);
      for (int depth = 0; depth <= 6; ++depth) {
        std::vector<SpecMode> modes = {SpecMode::Ngram};
        if (has_mtp) modes.push_back(SpecMode::Mtp);
        for (SpecMode mode : modes) {
          GenParams p = plain;
          p.spec.mode = mode;
          p.spec.depth = depth;
          p.spec.lookup_min = depth % 2 ? 1 : 2;  // single-token matches too: random models repeat little
          const SpecOutcome got = run_spec(*e, m.prompt, p);
          expect_same(got, ref, std::string(spec_mode_name(mode)) + " depth " + std::to_string(depth));
          EXPECT_EQ(got.spec.mode, spec_mode_name(mode));
          if (mode == SpecMode::Mtp) EXPECT_GT(got.spec.rounds, 0);
          else ngram_rounds += got.spec.rounds;
          if (depth > 0) {
            for (size_t k = size_t(depth) + 1; k < got.spec.depth_rounds.size(); ++k) EXPECT_EQ(got.spec.depth_rounds[k], 0);
          }
        }
      }
    }
  }
  EXPECT_GT(ngram_rounds, 0) << "prompt lookup drafted";
}

// Records each round's context and draft of the drafter it wraps.
class RecordingDrafter final : public DrafterWrapper {
 public:
  using DrafterWrapper::DrafterWrapper;
  void begin(const DraftRequest& r) override {
    ctx_.assign(r.tokens.begin(), r.tokens.end());
    inner_->begin(r);
  }
  Draft draft(SequenceState& st) override {
    Draft d = inner_->draft(st);
    rounds.push_back({ctx_, d.tokens});
    return d;
  }
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> rounds;  // (context, draft)

 private:
  std::vector<int32_t> ctx_;
};

// The MTP drafter inside the loop (catch-up rows after prompt chunks and verifications, chains through
// h') drafts what the reference MTP head drafts from the same context, every round. (The goldens' random
// MTP heads agree with their main models only by chance, so acceptance itself says little here.)
TEST(Spec, MtpDraftsInTheLoopEqualTheReference) {
  for (const char* name : {"qwen3_5_moe_text-a-mtp", "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"}) {
    SCOPED_TRACE(name);
    SpecModel m = open_model(name);
    cpu::CpuBackend ref_be(m.w);
    for (Engine* e : {m.host.get(), m.dev.get()})
      for (int depth : {1, 3, 5}) {
        LoopOptions lo;
        lo.prefill_chunk = 17;  // the prompt in chunks: catch-up rows per chunk
        auto rec = std::make_shared<RecordingDrafter>(make_mtp_drafter(*m.w, SpecParams{}, 1));
        GenParams p;
        p.prompt = m.prompt;
        p.max_tokens = 24;
        p.spec.drafter = rec;
        p.spec.depth = depth;
        Session s(*e);
        auto job = std::make_shared<test_support::RecordingJob>(p);
        GenerationLoop loop(*e, lo);
        loop.add(job, s, 0);
        while (!loop.empty()) loop.step();
        ASSERT_GT(rec->rounds.size(), 3u);
        for (const auto& [ctx, draft] : rec->rounds) {
          if (draft.empty()) continue;
          auto st = ref_be.new_state(256);
          const auto h = cpu::final_hidden_states(ref_be, *st, std::span(ctx).first(ctx.size() - 1), 2048, nullptr);
          EXPECT_EQ(draft, cpu::mtp_greedy_draft(*m.w, ctx, h.data(), int64_t(draft.size())))
              << "depth " << depth << " at " << ctx.size() << " tokens";
        }
      }
    // on the device path the greedy drafts came back as argmax ids drawn by the backend
    EXPECT_GT(static_cast<test_support::SamplingCpuBackend&>(m.dev->backend()).mtp_draws, 0);
  }
}

// MTP drafts from a draft head of the first 256 ids (SpecParams::draft_vocab): the output stays the plain
// output on both loop paths, and every draft lies in the head (the goldens' 320-id vocabularies would put
// ~20% of unrestricted argmaxes past it).
TEST(Spec, DraftHeadKeepsTheOutput) {
  for (const char* name : {"qwen3_5_moe_text-a-mtp", "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"}) {
    SCOPED_TRACE(name);
    SpecModel m = open_model(name);
    GenParams plain;
    plain.max_tokens = 24;
    for (Engine* e : {m.host.get(), m.dev.get()}) {
      const SpecOutcome ref = run_spec(*e, m.prompt, plain);
      for (int depth : {1, 3}) {
        SpecParams mtp_only;
        mtp_only.fallback_match = 0;  // no prompt-lookup drafts (they may hold any id of the context)
        auto rec = std::make_shared<RecordingDrafter>(make_mtp_drafter(*m.w, mtp_only, 1));
        GenParams p = plain;
        p.spec.drafter = rec;
        p.spec.depth = depth;
        p.spec.draft_vocab = 256;
        const SpecOutcome got = run_spec(*e, m.prompt, p);
        expect_same(got, ref, "draft head, depth " + std::to_string(depth));
        size_t drafted = 0;
        for (const auto& [ctx, draft] : rec->rounds)
          for (int32_t t : draft) {
            EXPECT_LT(t, 256) << "a draft past the head at " << ctx.size() << " tokens";
            ++drafted;
          }
        EXPECT_GT(drafted, 10u);
      }
    }
  }
  SpecParams bad;
  bad.draft_vocab = 100;
  try {
    validate(bad);
    ADD_FAILURE() << "a 100-id draft head was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("draft vocabulary must be 0 (every id) or at least 256 ids (got 100)"),
              std::string::npos) << e.what();
  }
}

// Every accept count 0..k for k = 1..6 through the replay drafter (the plain continuation with a scripted
// number of correct tokens per round): the output is the plain output and each round accepts exactly its
// scripted count.
TEST(Spec, ReplayExercisesEveryAcceptCount) {
  for (const char* name : kAll) {
    SCOPED_TRACE(name);
    SpecModel m = open_model(name);
    if (!m.w) continue;
    GenParams plain;
    plain.max_tokens = 40;
    for (Engine* e : {m.host.get(), m.dev.get()}) {
      const SpecOutcome ref = run_spec(*e, m.prompt, plain);
      for (int k = 1; k <= 6; ++k) {
        std::vector<int> schedule;
        for (int a = k; a >= 0; --a) schedule.push_back(a);
        auto d = std::make_shared<test_support::ReplayDrafter>(m.prompt.size(), ref.r.tokens, schedule, m.w->cfg.vocab);
        GenParams p = plain;
        p.spec.drafter = d;
        p.spec.depth = k;
        const SpecOutcome got = run_spec(*e, m.prompt, p);
        expect_same(got, ref, "replay k " + std::to_string(k));
        std::set<int> seen;
        for (size_t r = 0; r < d->outcomes.size(); ++r) {
          const auto [drafted, accepted] = d->outcomes[r];
          if (drafted < k) continue;  // the last rounds, cut by max_tokens
          EXPECT_EQ(accepted, schedule[r % schedule.size()]) << "round " << r;
          seen.insert(accepted);
        }
        EXPECT_EQ(int(seen.size()), k + 1) << "accept counts 0.." << k;
        EXPECT_EQ(got.spec.rounds, int64_t(d->outcomes.size()));
      }
    }
  }
}

// End conditions that fall inside a round (a stop id among the accepted drafts, max_tokens, the callback,
// a full context) end it where plain decoding does, with the same end state.
TEST(Spec, EndConditionsInsideARound) {
  SpecModel m = open_model("qwen3_5_moe_text-a-mtp");
  GenParams plain;
  plain.max_tokens = 30;
  for (Engine* e : {m.host.get(), m.dev.get()}) {
    const SpecOutcome ref = run_spec(*e, m.prompt, plain);
    struct Case {
      std::string name;
      GenParams p;
      int stop_after = -1;
      int64_t ctx = 0;
    };
    std::vector<Case> cs;
    for (size_t at : {size_t(3), size_t(10), size_t(17)}) {
      GenParams p = plain;
      p.stop_ids = {ref.r.tokens[at]};
      cs.push_back({"stop id at " + std::to_string(at), p});
    }
    for (int64_t mt : {1, 2, 7, 13}) {
      GenParams p = plain;
      p.max_tokens = mt;
      cs.push_back({"max_tokens " + std::to_string(mt), p});
    }
    cs.push_back({"callback stop", plain, 9});
    for (int64_t extra : {1, 2, 5, 11}) cs.push_back({"context +" + std::to_string(extra), plain, -1, int64_t(m.prompt.size()) + extra});
    for (Case& c : cs) {
      SCOPED_TRACE(c.name);
      const SpecOutcome want = run_spec(*e, m.prompt, c.p, c.stop_after, c.ctx);
      for (int depth : {1, 3, 6}) {
        auto d = std::make_shared<test_support::ReplayDrafter>(m.prompt.size(), ref.r.tokens, std::vector<int>{}, m.w->cfg.vocab);
        GenParams p = c.p;
        p.spec.drafter = d;  // always right: rounds run through the end condition
        p.spec.depth = depth;
        expect_same(run_spec(*e, m.prompt, p, c.stop_after, c.ctx), want, "depth " + std::to_string(depth));
        GenParams q = c.p;
        q.spec.mode = SpecMode::Mtp;
        q.spec.depth = depth;
        expect_same(run_spec(*e, m.prompt, q, c.stop_after, c.ctx), want, "mtp depth " + std::to_string(depth));
      }
    }
  }
}

// Several speculative streams (and a plain one) in one loop, prompts chunked into the decode steps: each
// gets its solo tokens; the verification groups shared steps.
TEST(Spec, StreamsSteppedTogetherGetTheirSoloTokens) {
  SpecModel m = open_model("qwen3_next-a-mtp");
  for (Engine* e : {m.host.get(), m.dev.get()}) {
    const int S = 5;
    std::vector<GenParams> ps;
    for (int i = 0; i < S; ++i) {
      GenParams p;
      p.prompt.assign(m.prompt.begin() + i, m.prompt.begin() + 12 + 3 * i);
      p.max_tokens = 12 + 2 * i;
      p.spec.mode = i % 3 == 0 ? SpecMode::Mtp : i % 3 == 1 ? SpecMode::Ngram : SpecMode::Off;
      p.spec.depth = i == 3 ? 0 : 1 + i;
      if (i == 4) {
        p.sampling.temperature = 0.8f;
        p.sampling.seed = 11;
      }
      ps.push_back(p);
    }
    std::vector<std::vector<int32_t>> solo;
    for (auto& p : ps) solo.push_back(run_spec(*e, p.prompt, p).r.tokens);
    LoopOptions lo;
    lo.step_tokens = 10;
    const auto jobs = test_support::run_together(*e, ps, lo).jobs;
    for (int i = 0; i < S; ++i) {
      if (i == 4) continue;  // sampled: same distribution, not the same draws (below)
      EXPECT_EQ(jobs[size_t(i)]->ids, solo[size_t(i)]) << e->backend().name() << " stream " << i;
    }
    EXPECT_EQ(jobs[4]->ids.size(), solo[4].size());
    EXPECT_GT(jobs[0]->wait().spec.rounds, 0);
  }
}

TEST(Spec, BadInputIsRefusedWithItsCause) {
  SpecModel m = open_model("qwen3_next-a");  // no MTP block
  Session s(*m.host);
  GenParams p;
  p.max_tokens = 4;
  p.spec.mode = SpecMode::Mtp;
  try {
    generate(s, m.prompt, p);
    ADD_FAILURE() << "accepted --spec mtp without an MTP block";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("mtp.fc.weight"), std::string::npos) << e.what();
  }
  p.spec.mode = SpecMode::Ngram;
  p.spec.depth = kMaxSpecDepth + 1;
  EXPECT_THROW(generate(s, m.prompt, p), InputError);
  EXPECT_THROW(parse_spec_depth("0", "--spec-depth"), InputError);
  EXPECT_THROW(parse_spec_depth("17", "--spec-depth"), InputError);
  EXPECT_THROW(parse_spec_depth("x", "--spec-depth"), InputError);
  EXPECT_EQ(parse_spec_depth("auto", "--spec-depth"), 0);
  EXPECT_EQ(parse_spec_depth("16", "--spec-depth"), 16);
  EXPECT_THROW(parse_spec_mode("eagle", "--spec"), InputError);
  // a drafter proposing ids outside the vocabulary ends its request with an error, not the loop
  class BadDrafter final : public Drafter {
   public:
    std::string name() const override { return "bad"; }
    void begin(const DraftRequest&) override {}
    Draft draft(SequenceState&) override { return Draft{{int32_t(1) << 30}, {}}; }
  };
  GenParams b;
  b.max_tokens = 4;
  b.spec.drafter = std::make_shared<BadDrafter>();
  Session s2(*m.host);
  EXPECT_THROW(generate(s2, m.prompt, b), InternalError);
}

// Prompt lookup: the longest suffix match, its most recent occurrence, the continuation.
TEST(Spec, PromptLookup) {
  const std::vector<int32_t> t = {1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3};
  Lookup a = prompt_lookup(t, 2, 8, 3);
  EXPECT_EQ(a.match, 3);
  EXPECT_EQ(a.tokens, (std::vector<int32_t>{5, 7, 1}));  // the most recent occurrence of [1 2 3]
  Lookup b = prompt_lookup(t, 4, 8, 3);
  EXPECT_EQ(b.match, 0);
  const std::vector<int32_t> u = {7, 1, 2, 3, 4, 9, 8, 1, 2, 3, 5, 6, 7, 1, 2, 3};
  Lookup c = prompt_lookup(u, 1, 8, 2);
  EXPECT_EQ(c.match, 4) << "[7 1 2 3] beats the more recent [1 2 3]";
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{4, 9}));
  EXPECT_EQ(prompt_lookup(std::vector<int32_t>{5}, 1, 4, 4).match, 0);
  Lookup d = prompt_lookup(std::vector<int32_t>{3, 3, 3}, 1, 4, 5);
  EXPECT_EQ(d.match, 2);
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{3}));
}

}  // namespace
