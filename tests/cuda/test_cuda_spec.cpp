// Speculative decoding on the CUDA backend in the one generation loop (runtime/spec.h): greedy output with
// speculation equals plain greedy output for depths 1..6 and auto with the MTP drafter and prompt lookup, on
// the device-sampled pipelined path and the host path (a different token only at a near-tie of the plain
// logits: verification rows run with other row counts than decode rows); several speculative streams
// beside a plain one in one loop; sampled speculation reproduces with its seed.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaSpec, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "../support/recording_job.h"
#include "backend/cuda/cuda_backend.h"
#include "core/mapped_file.h"
#include "runtime/engine.h"
#include "runtime/session.h"

using namespace lily;

namespace {

struct SpecModel {
  std::unique_ptr<Engine> e;
  std::vector<int32_t> prompt;
  bool mtp = false;
};

// A golden model on the CUDA backend and a prompt of 40 of its ids plus a repeated stretch (prompt lookup
// finds matches); null engine when absent.
SpecModel open(const std::string& name) {
  SpecModel m;
  const std::string dir = test::golden_dir(name);
  if (dir.empty()) return m;
  EngineOptions eo;
  eo.backend = "cuda";
  eo.ctx_size = 160;
  m.e = Engine::open(dir, eo);
  m.mtp = m.e->weights().mtp.has_value();
  auto ids = nlohmann::json::parse(read_text_file(dir + "/golden.json"))["prompt_ids"].get<std::vector<int32_t>>();
  m.prompt.assign(ids.begin(), ids.begin() + 40);
  m.prompt.insert(m.prompt.end(), ids.begin() + 5, ids.begin() + 17);
  return m;
}

struct SpecOutcome {
  std::vector<int32_t> tokens;
  std::string finish;
  SpecStats spec;
  bool device = false;
};

// The requests in one loop, each on its own session; their outcomes in order.
std::vector<SpecOutcome> run_all(Engine& e, const std::vector<GenParams>& ps) {
  std::vector<SpecOutcome> out;
  for (auto& j : test_support::run_together(e, ps).jobs) {
    const GenResult r = j->wait();
    EXPECT_NE(r.finish_reason, "error") << r.error;
    out.push_back({j->ids, r.finish_reason, r.spec, r.device_sampled});
  }
  return out;
}

SpecOutcome run(Engine& e, const GenParams& p) { return run_all(e, {p}).front(); }

// `got` equals the plain greedy tokens `ref`, or first differs where the plain logits (host path, one row
// per step) have a near-tie between the two tokens. Returns whether they differ.
bool expect_greedy_equal(Engine& e, const std::vector<int32_t>& prompt, const SpecOutcome& got, const SpecOutcome& ref,
                         const std::string& what) {
  size_t j = 0;
  while (j < got.tokens.size() && j < ref.tokens.size() && got.tokens[j] == ref.tokens[j]) ++j;
  if (j == got.tokens.size() && j == ref.tokens.size()) {
    EXPECT_EQ(got.finish, ref.finish) << what;
    return false;
  }
  if (j == got.tokens.size() || j == ref.tokens.size()) {
    ADD_FAILURE() << what << ": " << got.tokens.size() << " tokens against the plain run's " << ref.tokens.size();
    return true;
  }
  Session s(e);
  std::vector<float> l(size_t(e.config().vocab));
  s.prefill(prompt, l.data());
  for (size_t i = 0; i < j; ++i) s.decode(ref.tokens[i], l.data());
  double ss = 0;
  for (float x : l) ss += double(x) * x;
  const double rms = std::sqrt(ss / double(l.size()));
  const double gap = std::abs(double(l[size_t(ref.tokens[j])]) - l[size_t(got.tokens[j])]);
  EXPECT_LE(gap, 1e-2 * std::max(1.0, rms)) << what << ": token " << j << " is " << got.tokens[j] << ", plain "
                                            << ref.tokens[j] << " (logit gap " << gap << ")";
  std::printf("[%s] token %zu differs at a near-tie (plain logit gap %.3g)\n", what.c_str(), j, gap);
  return true;
}

TEST(CudaSpec, GreedyEqualsPlainForEveryDepthAndDrafter) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  int64_t ngram_rounds = 0, mtp_rounds = 0;
  int runs = 0, flips = 0;
  for (const char* name : {"qwen3_5_moe_text-a-mtp", "qwen3_next-a-mtp", "qwen3_5_moe_text-a"}) {
    SCOPED_TRACE(name);
    SpecModel m = open(name);
    if (!m.e) continue;
    for (bool device : {true, false}) {
      GenParams plain;
      plain.prompt = m.prompt;
      plain.max_tokens = 28;
      plain.use_cache = false;
      plain.allow_device = device;
      const SpecOutcome ref = run(*m.e, plain);
      ASSERT_EQ(ref.tokens.size(), 28u);
      EXPECT_EQ(ref.device, device);
      for (int depth = 0; depth <= 6; ++depth) {
        std::vector<SpecMode> modes = {SpecMode::Ngram};
        if (m.mtp) modes.push_back(SpecMode::Mtp);
        for (SpecMode mode : modes) {
          GenParams p = plain;
          p.spec.mode = mode;
          p.spec.depth = depth;
          p.spec.lookup_min = depth % 2 ? 1 : 2;  // single-token matches too: random models repeat little
          const SpecOutcome got = run(*m.e, p);
          const std::string what = std::string(name) + (device ? " device " : " host ") + spec_mode_name(mode) + " depth " +
                                   (depth ? std::to_string(depth) : "auto");
          flips += expect_greedy_equal(*m.e, m.prompt, got, ref, what) ? 1 : 0;
          ++runs;
          EXPECT_EQ(got.device, device) << what;
          EXPECT_EQ(got.spec.mode, spec_mode_name(mode)) << what;
          if (mode == SpecMode::Mtp) {
            EXPECT_GT(got.spec.rounds, 0) << what;
            mtp_rounds += got.spec.rounds;
          } else {
            ngram_rounds += got.spec.rounds;
          }
          for (size_t k = size_t(depth) + 1; depth > 0 && k < got.spec.depth_rounds.size(); ++k)
            EXPECT_EQ(got.spec.depth_rounds[k], 0) << what << ": a round deeper than asked";
        }
      }
    }
  }
  EXPECT_GT(ngram_rounds, 0) << "prompt lookup drafted";
  EXPECT_GT(mtp_rounds, 0) << "the MTP head drafted";
  std::printf("[CudaSpec] %d runs, %d at a near-tie, %lld MTP rounds, %lld prompt-lookup rounds\n", runs, flips,
              (long long)mtp_rounds, (long long)ngram_rounds);
}

// Speculative streams (MTP at depth 3 and auto, prompt lookup at depth 2) beside a plain one in one loop:
// each gets its tokens alone.
TEST(CudaSpec, StreamsTogetherMatchEachAlone) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  SpecModel m = open("qwen3_5_moe_text-a-mtp");
  if (!m.e) GTEST_SKIP() << "golden model not present";
  std::vector<GenParams> ps(4);
  for (size_t i = 0; i < ps.size(); ++i) {
    ps[i].prompt = std::vector<int32_t>(m.prompt.begin() + std::ptrdiff_t(i), m.prompt.end());
    ps[i].max_tokens = 20 + int64_t(i);
    ps[i].use_cache = false;
  }
  ps[0].spec.mode = SpecMode::Mtp;
  ps[0].spec.depth = 3;
  ps[1].spec.mode = SpecMode::Mtp;
  ps[2].spec.mode = SpecMode::Ngram;
  ps[2].spec.depth = 2;
  ps[2].spec.lookup_min = 1;
  const auto together = run_all(*m.e, ps);
  for (size_t i = 0; i < ps.size(); ++i) {
    GenParams plain = ps[i];
    plain.spec = SpecParams{};
    const SpecOutcome alone = run(*m.e, plain);
    expect_greedy_equal(*m.e, ps[i].prompt, together[i], alone, "stream " + std::to_string(i));
    EXPECT_TRUE(together[i].device) << "stream " << i;
  }
  EXPECT_GT(together[0].spec.rounds, 0);
  EXPECT_GT(together[1].spec.rounds, 0);
}

// Sampled requests with MTP drafts on the device path: verified by device draws matched against the
// drafts; the same seed gives the same tokens.
TEST(CudaSpec, SampledSpeculationReproducesWithItsSeed) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  SpecModel m = open("qwen3_next-a-mtp");
  if (!m.e) GTEST_SKIP() << "golden model not present";
  GenParams p;
  p.prompt = m.prompt;
  p.max_tokens = 32;
  p.use_cache = false;
  p.sampling.temperature = 0.8f;
  p.sampling.top_k = 40;
  p.sampling.seed = 7;
  p.spec.mode = SpecMode::Mtp;
  p.spec.depth = 3;
  const SpecOutcome a = run(*m.e, p), b = run(*m.e, p);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 32u);
  EXPECT_TRUE(a.device);
  EXPECT_GT(a.spec.rounds, 0);
}

}  // namespace
#endif
