// `lily bench --spec`: the speculative bench on a tiny synth model (its MTP head random like the rest):
// the oracle's acceptance is what was asked for, output equals the plain pass (checked inside), the
// round-cost table and auto's picks are reported, JSON too; bad values are refused; a run that leaves
// the continuation is repeated with its own output until it reproduces it.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "tools/bench.h"
#include "tools/synth.h"

namespace lily {
namespace {

TEST(BenchSpec, KnownAcceptanceOnATinySynthModel) {
  SynthOptions o;
  o.preset = "tiny";
  o.format = SynthFormat::Affine4;
  auto w = synth_model(o);
  BenchOptions b;
  b.prefill = {8};
  b.decode_context = {8};
  b.repeats = 1;
  b.decode_tokens = 10;
  b.progress = false;
  b.stream_context = 40;
  b.spec = "mtp";
  b.acceptance = {1.0, 0.0};
  b.spec_depth = {3, 0};
  auto rep = run_bench(w, b);
  ASSERT_TRUE(rep.spec.has_value());
  const SpecReport& s = *rep.spec;
  EXPECT_GT(s.plain_tok_s, 0);
  ASSERT_EQ(s.rows.size(), 4u);
  for (const SpecRow& r : s.rows) {
    EXPECT_GT(r.tok_s, 0);
    EXPECT_GT(r.speedup, 0);
    if (r.acceptance == 1.0) {
      EXPECT_EQ(r.accepted, 1.0);
    }
    if (r.acceptance == 0.0) {
      EXPECT_EQ(r.accepted, 0.0);
      EXPECT_EQ(r.tokens_per_round, 1.0);
    }
    if (r.acceptance == 1.0 && r.depth == 3) {
      EXPECT_GT(r.tokens_per_round, 3.0) << "3 drafts + 1 per round, the last cut";
    }
  }
  ASSERT_EQ(s.costs.size(), 7u);
  for (const SpecCostRow& c : s.costs) EXPECT_GT(c.round_ms, 0) << "k " << c.k;
  EXPECT_GT(s.costs[3].draft_ms, 0);
  ASSERT_EQ(s.auto_picks.size(), 4u);
  EXPECT_EQ(s.diverged, 0) << "the CPU's speculative output is the plain output";
  EXPECT_EQ(s.rerecorded, 0) << "nothing to repeat on the CPU";
  for (auto [a, k] : s.auto_picks) EXPECT_TRUE(k >= 0 && k <= 6);
  auto j = rep.to_json();
  EXPECT_EQ(j["spec"]["rows"][0]["depth"], 3);
  EXPECT_EQ(j["spec"]["rows"][1]["depth"], "auto");
  EXPECT_TRUE(j["spec"]["round_costs"][6]["round_ms"].is_number());
  EXPECT_EQ(j["spec"]["rerecorded_passes"], 0);
  EXPECT_NE(rep.table().find("auto picks"), std::string::npos);
  // prompt lookup too (its drafts replaced the same way)
  b.spec = "ngram";
  b.acceptance = {1.0};
  b.spec_depth = {2};
  auto ng = run_bench(w, b);
  ASSERT_TRUE(ng.spec && ng.spec->rows.size() == 1u);
  b.spec = "mtp";
  b.acceptance = {1.5};
  EXPECT_THROW(run_bench(w, b), InputError);
  b.acceptance = {0.5};
  b.spec_depth = {17};
  EXPECT_THROW(run_bench(w, b), InputError);
}

// A target whose choice at a near-tie depends on the drafts before it: at positions 5 and 11 it emits
// another token than the plain pass while the continuation it follows has been right so far (long
// verification steps decide the tie otherwise than one-row steps). Each pass moves the first
// difference later until the output is its own continuation.
TEST(BenchSpec, ReproduceContinuationFollowsTheRunsOwnOutput) {
  const std::vector<int32_t> plain = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7};
  int calls = 0;
  auto run = [&](const std::vector<int32_t>& t) {
    ++calls;
    std::vector<int32_t> out;
    for (size_t j = 0; j < plain.size(); ++j) {
      int32_t x = plain[j];
      const bool tie = j == 5 || j == 11;
      if (tie && t.size() >= j && std::equal(out.begin(), out.end(), t.begin())) x = plain[j] + 100;
      out.push_back(x);
    }
    return out;
  };
  std::vector<int32_t> truth = plain;
  const int passes = reproduce_continuation(truth, run);
  EXPECT_EQ(passes, 2) << "pass 1 differs at 5, pass 2 at 11, pass 3 reproduces pass 2";
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(run(truth), truth);
  EXPECT_EQ(truth[5], plain[5] + 100);
  EXPECT_EQ(truth[11], plain[11] + 100);
  // An output that never settles is reported, with the last output kept.
  int flips = 0;
  auto unstable = [&](const std::vector<int32_t>&) { return std::vector<int32_t>{++flips}; };
  std::vector<int32_t> t2 = {0};
  EXPECT_EQ(reproduce_continuation(t2, unstable, 3), -1);
  EXPECT_EQ(t2, std::vector<int32_t>{3});
  // Agreement at once costs one pass.
  calls = 0;
  std::vector<int32_t> same = truth;
  EXPECT_EQ(reproduce_continuation(same, run), 0);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace lily
