// Generation through the generation loop's device path (runtime::generate on the CUDA backend: ids drawn
// and fed on the device, steps pipelined) on a golden model against the host path on the same backend:
// the same tokens and stops, and the state after the run; sampled runs reproduce and stay in the host's
// kept set.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaSampleGenerate, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "core/mapped_file.h"
#include "cuda_test_util.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace fs = std::filesystem;
using namespace lily;

namespace {

// Generation on a golden model: the device path (runtime::generate on the CUDA backend) against the host
// path on the same backend (allow_device = false).
struct GoldenRun {
  std::unique_ptr<Engine> e;
  std::vector<int32_t> prompt, greedy;
};

GoldenRun open_golden(const std::string& dir, int64_t ctx) {
  GoldenRun g;
  auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
  auto ids = j["prompt_ids"].get<std::vector<int32_t>>();
  g.prompt.assign(ids.begin(), ids.begin() + j["greedy_prompt_len"].get<int64_t>());
  g.greedy = j["greedy_ids"].get<std::vector<int32_t>>();
  EngineOptions eo;
  eo.backend = "cuda";
  eo.ctx_size = ctx;
  g.e = Engine::open(dir, eo);
  return g;
}

constexpr int32_t kProbe = 7;  // a token decoded after the run: its logits show what the state holds

struct GenerateOutcome {
  GenerateResult r;
  std::vector<int32_t> seen;  // ids the callback received
  std::vector<int32_t> session_tokens;
  std::vector<float> last_logits;   // empty when the step that absorbed the last token read none back
  std::vector<float> probe_logits;  // after decoding kProbe on the session (empty when its context is full)
  int64_t capacity = 0;
};

GenerateOutcome run(Engine& e, const std::vector<int32_t>& prompt, GenerateOptions go, bool device, int stop_after = -1,
            int64_t ctx = 0) {
  Session s(e, ctx);
  go.allow_device = device;
  GenerateOutcome o;
  o.r = generate(s, prompt, go, [&](int32_t t, std::span<const float>) {
    o.seen.push_back(t);
    return stop_after < 0 || int(o.seen.size()) < stop_after;
  });
  o.session_tokens = s.tokens();
  o.last_logits = s.last_logits();
  o.capacity = s.capacity();
  if (s.n_tokens() < s.capacity()) {
    o.probe_logits.resize(size_t(e.config().vocab));
    s.decode(kProbe, o.probe_logits.data());
  }
  return o;
}

// Logits after absorbing exactly `ids` (prefill + one decode step per token, the host path's steps).
std::vector<float> logits_after(Engine& e, const std::vector<int32_t>& prompt, const std::vector<int32_t>& gen) {
  Session s(e);
  std::vector<float> l(size_t(e.config().vocab));
  s.prefill(prompt, l.data());
  for (int32_t t : gen) s.decode(t, l.data());
  return l;
}

double max_diff_over_rms(const std::vector<float>& got, const std::vector<float>& ref) {
  double d = 0, rms = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    d = std::max(d, double(std::abs(got[i] - ref[i])));
    rms += double(ref[i]) * ref[i];
  }
  return d / std::max(1.0, std::sqrt(rms / double(ref.size())));
}

// The session after a run holds prompt + the first `absorbed` emitted tokens, in its token list and in its
// device state: the logits after one more token equal those of a fresh session fed the same tokens. Its
// last_logits are those after the absorbed tokens, or empty (Session: the absorbing step read none back).
void expect_state(Engine& e, const std::vector<int32_t>& prompt, const GenerateOutcome& o, size_t absorbed) {
  std::vector<int32_t> want = prompt;
  want.insert(want.end(), o.r.tokens.begin(), o.r.tokens.begin() + std::ptrdiff_t(absorbed));
  EXPECT_EQ(o.session_tokens, want) << "session tokens = prompt + the absorbed emitted tokens";
  std::vector<int32_t> gen(want.begin() + std::ptrdiff_t(prompt.size()), want.end());
  if (!o.last_logits.empty()) {
    const auto ref = logits_after(e, prompt, gen);
    ASSERT_EQ(o.last_logits.size(), ref.size());
    EXPECT_LT(max_diff_over_rms(o.last_logits, ref), 1e-3) << "last_logits = the logits after exactly those tokens";
  }
  if (o.probe_logits.empty()) {
    EXPECT_EQ(int64_t(want.size()), o.capacity) << "only a full context leaves no room for the probe";
    return;
  }
  gen.push_back(kProbe);
  const auto ref = logits_after(e, prompt, gen);
  ASSERT_EQ(o.probe_logits.size(), ref.size());
  EXPECT_LT(max_diff_over_rms(o.probe_logits, ref), 1e-3) << "the state holds exactly those tokens";
}

TEST(CudaSampleGenerate, DevicePathMatchesHostPath) {
  LILY_REQUIRE_GPU();
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  if (dir.empty()) GTEST_SKIP() << "golden model not present";
  auto g = open_golden(dir, 256);
  Engine& e = *g.e;
  const auto& prompt = g.prompt;
  const int64_t n = int64_t(g.greedy.size());

  // greedy: both paths give the reference ids; the device session absorbed all of them
  GenerateOptions go;
  go.max_tokens = n;
  GenerateOutcome dev = run(e, prompt, go, true), host = run(e, prompt, go, false);
  EXPECT_EQ(dev.r.tokens, g.greedy);
  EXPECT_EQ(host.r.tokens, g.greedy);
  EXPECT_EQ(dev.seen, dev.r.tokens);
  EXPECT_TRUE(dev.r.device_sampled) << "the device path drew the tokens";
  EXPECT_FALSE(host.r.device_sampled);
  EXPECT_EQ(dev.r.finish_reason, "length");
  EXPECT_EQ(host.r.finish_reason, "length");
  expect_state(e, prompt, dev, size_t(n));
  expect_state(e, prompt, host, size_t(n));

  // greedy with penalties (the sampler graph at temperature 0) against the host sampler
  GenerateOptions pen = go;
  pen.sampling.repetition_penalty = 1.5f;
  pen.sampling.frequency_penalty = 0.5f;
  pen.penalize_prompt = true;
  dev = run(e, prompt, pen, true);
  host = run(e, prompt, pen, false);
  EXPECT_EQ(dev.r.tokens, host.r.tokens) << "penalised greedy";

  // a stop id: emitted, then the end; the device state holds it
  GenerateOptions st = go;
  const int32_t stop = g.greedy[5];
  st.stop_ids = {stop};
  dev = run(e, prompt, st, true);
  host = run(e, prompt, st, false);
  EXPECT_EQ(dev.r.tokens, host.r.tokens);
  EXPECT_EQ(dev.r.tokens.back(), stop);
  EXPECT_EQ(dev.r.finish_reason, "stop");
  EXPECT_EQ(host.r.finish_reason, "stop");
  expect_state(e, prompt, dev, dev.r.tokens.size());

  // the callback stops after 3 ids (draws the device made ahead are discarded)
  dev = run(e, prompt, go, true, 3);
  host = run(e, prompt, go, false, 3);
  EXPECT_EQ(dev.r.tokens.size(), 3u);
  EXPECT_EQ(dev.r.tokens, host.r.tokens);
  EXPECT_EQ(dev.r.finish_reason, "stop");
  expect_state(e, prompt, dev, 3);

  // max_tokens 1 and 4
  for (int64_t m : {1, 4}) {
    GenerateOptions mt = go;
    mt.max_tokens = m;
    dev = run(e, prompt, mt, true);
    host = run(e, prompt, mt, false);
    EXPECT_EQ(dev.r.tokens, host.r.tokens);
    EXPECT_EQ(int64_t(dev.r.tokens.size()), m);
    EXPECT_EQ(dev.r.finish_reason, "length");
    expect_state(e, prompt, dev, size_t(m));
  }

  // context full: room for 3 more tokens; the 4th emitted id cannot be absorbed
  const int64_t ctx = int64_t(prompt.size()) + 3;
  dev = run(e, prompt, go, true, -1, ctx);
  host = run(e, prompt, go, false, -1, ctx);
  EXPECT_EQ(dev.r.tokens, host.r.tokens);
  EXPECT_EQ(dev.r.tokens.size(), 4u);
  EXPECT_EQ(dev.r.finish_reason, "length");
  expect_state(e, prompt, dev, 3);
}

TEST(CudaSampleGenerate, SampledTokensReproduceAndStayInTheHostSet) {
  LILY_REQUIRE_GPU();
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  if (dir.empty()) GTEST_SKIP() << "golden model not present";
  auto g = open_golden(dir, 256);
  Engine& e = *g.e;
  GenerateOptions go;
  go.max_tokens = 48;
  go.sampling.temperature = 0.9f;
  go.sampling.top_k = 20;
  go.sampling.top_p = 0.9f;
  go.sampling.presence_penalty = 0.5f;
  go.sampling.seed = 1234;
  const GenerateOutcome a = run(e, g.prompt, go, true), b = run(e, g.prompt, go, true);
  EXPECT_EQ(a.r.tokens, b.r.tokens) << "same seed, same tokens";
  EXPECT_EQ(int64_t(a.r.tokens.size()), go.max_tokens);
  go.sampling.seed = 4321;
  const GenerateOutcome c = run(e, g.prompt, go, true);
  EXPECT_NE(a.r.tokens, c.r.tokens);
  expect_state(e, g.prompt, a, a.r.tokens.size());
  // every id lies in the host sampler's kept set at its step (logits through the host path's steps)
  Session s(e);
  std::vector<float> l(size_t(e.config().vocab));
  s.prefill(g.prompt, l.data());
  Sampler host(go.sampling);
  std::vector<int32_t> hist;
  for (int32_t t : a.r.tokens) {
    bool in = false;
    for (auto [id, pr] : host.distribution(l, hist)) in |= id == t;
    EXPECT_TRUE(in) << "id " << t << " at step " << hist.size();
    hist.push_back(t);
    s.decode(t, l.data());
  }
}

}  // namespace
#endif
