// The model split over N ranks (model/shard.h) run as N CPU ranks one after another (backend/cpu/cpu_rank.h,
// backend/rank_driver.h) against the unsplit CPU backend: the plans and their refusals, the shares' bytes,
// teacher-forced and decoded logits of the golden models at N = 1, 2, 4 and of the tiny-tp8 synth at N = 8
// (bf16, affine 4-bit, EXL3 where the tiles allow), MTP rows, several sequences, tentative rows and snapshots.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_rank.h"
#include "backend/rank_driver.h"
#include "core/mapped_file.h"
#include "model/qwen_hybrid.h"
#include "model/shard.h"
#include "../support/mtp_steps.h"
#include "test_util.h"
#include "tools/synth.h"

using namespace lily;

namespace {

using test::rel_maxdiff;

std::vector<int32_t> golden_prompt(const std::string& dir) {
  auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
  return j["prompt_ids"].get<std::vector<int32_t>>();
}

std::shared_ptr<const ModelWeights> tp8(SynthFormat f) {
  SynthOptions so;
  so.preset = "tiny-tp8";
  so.format = f;
  so.exl3_bits = 4;
  return synth_model(so);
}

// Logits of every prompt row: prefilled in chunks of `chunk` rows, then `decode` more tokens one a step
// (their logits appended).
std::vector<float> run(Backend& be, const std::vector<int32_t>& ids, int64_t chunk, int64_t decode) {
  const int64_t V = be.weights().cfg.vocab, T = int64_t(ids.size());
  auto st = be.new_state(T + decode + 1);
  std::vector<float> out(size_t((T + decode) * V));
  for (int64_t p = 0; p < T; p += chunk) {
    const int64_t n = std::min(chunk, T - p);
    forward_step(be, *st, std::span(ids).subspan(size_t(p), size_t(n)), n, out.data() + p * V);
  }
  int32_t next = int32_t(test::argmax(out.data() + (T - 1) * V, V));
  for (int64_t i = 0; i < decode; ++i) {
    float* row = out.data() + (T + i) * V;
    forward_step(be, *st, std::span(&next, 1), 1, row);
    next = int32_t(test::argmax(row, V));
  }
  return out;
}

// The split run against the unsplit one: teacher-forced prompt (whole, then in chunks of 7) and 8 decoded
// rows; returns the largest max |Δ| / RMS (the order of a sum of fp32 parts is all that differs: the
// chunkings of the unsplit model differ by as much, README "Fidelity").
double compare(std::shared_ptr<const ModelWeights> w, int ranks, const std::vector<int32_t>& ids, const char* what,
               const cpu::CpuOptions& opt = {}) {
  cpu::CpuBackend whole(w, opt);
  auto split = cpu::make_cpu_ranks(w, ranks, opt);
  double worst = 0;
  std::string each;
  for (int64_t chunk : {int64_t(ids.size()), int64_t(7)}) {
    const auto a = run(*split, ids, chunk, 8), b = run(whole, ids, chunk, 8);
    const double d = rel_maxdiff(a, b);
    each += fmt::format("{}chunk {}: {:.2e}", each.empty() ? "" : ", ", chunk, d);
    worst = std::max(worst, d);
    const int64_t V = w->cfg.vocab;
    for (size_t t = 0; t < a.size() / size_t(V); ++t)
      EXPECT_EQ(test::argmax(a.data() + t * V, V), test::argmax(b.data() + t * V, V)) << what << " row " << t;
  }
  std::printf("%s at %d ranks: max |dlogit| / RMS = %.2e (%s; prompt rows and 8 decoded rows)\n", what, ranks, worst,
              each.c_str());
  return worst;
}

// max |Δlogit| / RMS of the split model against the unsplit one (measured 3e-6 .. 2.4e-5 with -march=native;
// 5.3e-5 for tiny-tp8 affine4 at 8 ranks with LILY_NATIVE=OFF, whose CPU kernels round differently)
constexpr double kTol = 1e-4;

const std::vector<std::string> kGoldens = {"qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_text-a-mtp", "qwen3_5_moe_text-a-mtp",
                                "qwen3_next-a-mtp", "qwen3_5_moe_text-r"};

}  // namespace

TEST(ShardPlan, RangesOfTheGoldenShape) {
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  ASSERT_FALSE(dir.empty());
  auto w = ModelWeights::load(dir);  // Hq 4, Hkv 2, Hk 2, Hv 4, 8 experts, shared 96, vocab 320
  const ShardPlan p = ShardPlan::make(*w, 4);
  EXPECT_TRUE(p.kv_copied);
  EXPECT_TRUE(p.k_copied);
  for (int r = 0; r < 4; ++r) {
    const RankPlan& rp = p.rank[size_t(r)];
    EXPECT_EQ(rp.q_heads, (Range{r, r + 1}));
    EXPECT_EQ(rp.kv_heads, (Range{r / 2, r / 2 + 1}));
    EXPECT_EQ(rp.v_heads, (Range{r, r + 1}));
    EXPECT_EQ(rp.k_heads, (Range{r / 2, r / 2 + 1}));
    EXPECT_EQ(rp.experts, (Range{2 * r, 2 * r + 2}));
    EXPECT_EQ(rp.vocab, (Range{80 * r, 80 * r + 80}));
  }
  ASSERT_EQ(p.ffn.size(), 4u);
  for (const FfnCut& c : p.ffn) {  // bf16 shared expert of 96: four pieces of 24 (three 8-column units each)
    EXPECT_EQ(c.owner, -1);
    ASSERT_EQ(c.inter.size(), 4u);
    EXPECT_EQ(c.inter[3], (Range{72, 96}));
  }
  const ShardPlan p2 = ShardPlan::make(*w, 2);
  EXPECT_FALSE(p2.kv_copied);
  EXPECT_EQ(p2.rank[1].kv_heads, (Range{1, 2}));
  EXPECT_EQ(balanced_ranges(10, 4), (std::vector<Range>{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  EXPECT_EQ(balanced_ranges(300, 2, 128), (std::vector<Range>{{0, 256}, {256, 300}}));
}

TEST(ShardPlan, BadRankCountsNameTheField) {
  auto w = ModelWeights::load(test::golden_dir("qwen3_5_moe_text-a"));
  auto msg = [&](const ModelWeights& m, int n) {
    try {
      ShardPlan::make(m, n);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(*w, 3).find("num_attention_heads = 4 is not a multiple of 3"), std::string::npos) << msg(*w, 3);
  EXPECT_NE(msg(*w, 8).find("num_attention_heads"), std::string::npos) << msg(*w, 8);
  EXPECT_NE(msg(*w, 0).find("--devices"), std::string::npos);
  ModelWeights odd = *w;
  odd.cfg.n_heads = 12;
  odd.cfg.n_kv_heads = 3;  // 3 KV heads over 2 ranks: neither split nor copied
  EXPECT_NE(msg(odd, 2).find("num_key_value_heads = 3"), std::string::npos) << msg(odd, 2);
  ModelWeights few = *w;
  few.cfg.n_heads = 16;
  few.cfg.n_kv_heads = 16;
  few.cfg.lin_v_heads = 16;
  few.cfg.lin_k_heads = 16;
  EXPECT_NE(msg(few, 16).find("num_experts = 8"), std::string::npos) << msg(few, 16);
  // EXL3 cuts o_proj's input on 128-wide Hadamard blocks: one 64-wide head per rank is refused
  auto x = tp8(SynthFormat::Exl3);
  EXPECT_NE(msg(*x, 8).find("out_proj' (EXL3, 128-column Hadamard blocks) cannot be cut into the ranks' 64 input columns"),
            std::string::npos) << msg(*x, 8);
}

TEST(ShardPlan, ShareBytes) {
  for (SynthFormat f : {SynthFormat::BF16, SynthFormat::Affine4, SynthFormat::Exl3}) {
    auto w = tp8(f);
    const size_t whole = w->weight_bytes() + w->mtp_weight_bytes();
    EXPECT_EQ(rank_weight_bytes(*w, ShardPlan::make(*w, 1), 0), whole);
    for (int n : {2, 4}) {
      if (f == SynthFormat::Exl3 && n == 4) continue;
      const ShardPlan p = ShardPlan::make(*w, n);
      size_t sum = 0;
      for (int r = 0; r < n; ++r) {
        auto s = rank_share(w, p, r);
        const size_t b = rank_weight_bytes(*w, p, r);
        EXPECT_EQ(b, s->weight_bytes() + s->mtp_weight_bytes()) << synth_format_name(f) << " rank " << r;
        EXPECT_LT(b, whole);
        sum += b;
      }
      // at least the whole model over all ranks, at most the replicated embedding and routers more per rank
      EXPECT_GE(sum, whole - w->embed.nbytes()) << synth_format_name(f);
      std::printf("tiny-tp8 %s at %d ranks: %zu bytes per rank on average, whole %zu\n", synth_format_name(f), n, sum / size_t(n),
                  whole);
    }
  }
}

class ShardGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardGolden, LogitsMatchTheUnsplitModel) {
  const std::string dir = test::golden_dir(GetParam());
  if (dir.empty()) GTEST_SKIP() << GetParam() << " not present";
  auto w = ModelWeights::load(dir);
  const auto ids = golden_prompt(dir);
  for (int n : {1, 2, 4}) EXPECT_LE(compare(w, n, ids, GetParam().c_str()), kTol) << n << " ranks";
}

INSTANTIATE_TEST_SUITE_P(All, ShardGolden, ::testing::ValuesIn(kGoldens), test::ModelParamName());

TEST(ShardGoldenMtp, MtpRowsMatchTheUnsplitModel) {
  for (const char* name : {"qwen3_5_moe_text-a-mtp", "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"}) {
    const std::string dir = test::golden_dir(name);
    auto w = ModelWeights::load(dir);
    const auto ids = golden_prompt(dir);
    cpu::CpuBackend whole(w);
    auto st = whole.new_state(256);
    const auto ref = test_support::mtp_rows_via_steps(whole, *st, ids, 37, 5);
    for (int n : {2, 4}) {
      auto split = cpu::make_cpu_ranks(w, n);
      auto s2 = split->new_state(256);
      const double d = rel_maxdiff(test_support::mtp_rows_via_steps(*split, *s2, ids, 37, 5), ref);
      EXPECT_LE(d, kTol) << name << " " << n << " ranks";
      std::printf("%s MTP rows at %d ranks: max |dlogit| / RMS = %.2e\n", name, n, d);
    }
  }
}

TEST(ShardSynth, TinyTp8AtEightRanks) {
  const auto ids = test::random_ids(40, 512, 7);
  cpu::CpuOptions exact;
  exact.affine = cpu::AffinePath::Exact;  // int8 activations quantise a rank's columns on their own scale
  EXPECT_LE(compare(tp8(SynthFormat::BF16), 8, ids, "tiny-tp8 bf16"), kTol);
  for (int n : {2, 8}) EXPECT_LE(compare(tp8(SynthFormat::Affine4), n, ids, "tiny-tp8 affine4", exact), kTol);
  // EXL3 at 2 ranks: q rows and the head cut on 128-wide tiles, k / v rows (64 a rank) selected from the
  // whole product
  EXPECT_LE(compare(tp8(SynthFormat::Exl3), 2, ids, "tiny-tp8 exl3"), kTol);
  auto x = tp8(SynthFormat::Exl3);
  auto s = rank_share(x, ShardPlan::make(*x, 2), 1);
  const Linear& q = s->layers[3].attn.q;
  EXPECT_EQ(q.exl3->out_p, 512);
  EXPECT_EQ(q.exl3->out_rows, nullptr);
  EXPECT_NE(s->layers[3].attn.k.exl3->out_rows, nullptr);
}

TEST(ShardSteps, SequencesTentativeRowsAndSnapshots) {
  auto w = ModelWeights::load(test::golden_dir("qwen3_5_moe_text-a-mtp"));
  const int64_t V = w->cfg.vocab;
  const auto ids = golden_prompt(test::golden_dir("qwen3_5_moe_text-a-mtp"));
  cpu::CpuBackend whole(w);
  auto split = cpu::make_cpu_ranks(w, 2);
  // the same operations on both: two sequences in one step, 5 tentative rows of which 3 are kept, a snapshot
  // restored into a third sequence, one more step of all three
  auto ops = [&](Backend& be) {
    std::vector<float> out;
    auto a = be.new_state(256), b = be.new_state(256), c = be.new_state(256);
    Step s;
    s.add(*a, std::span(ids).first(20), 2);
    s.add(*b, std::span(ids).subspan(5, 33), 1);
    std::vector<float> l(size_t(3 * V));
    be.finish(forward(be, s), StepOutputs{l.data(), nullptr});
    out.insert(out.end(), l.begin(), l.end());
    a->reserve_tentative(5);
    Step t;
    t.add(*a, std::span(ids).subspan(20, 5), 5, true, false, true);
    l.resize(size_t(5 * V));
    be.finish(forward(be, t), StepOutputs{l.data(), nullptr});
    out.insert(out.end(), l.begin(), l.end());
    a->commit(3);
    EXPECT_EQ(a->n_tokens(), 23);
    c->restore(*a->snapshot());
    Step u;
    u.add(*a, std::span(ids).subspan(30, 1), 1);
    u.add(*b, std::span(ids).subspan(40, 2), 2);
    u.add(*c, std::span(ids).subspan(30, 1), 1);
    l.resize(size_t(4 * V));
    be.finish(forward(be, u), StepOutputs{l.data(), nullptr});
    out.insert(out.end(), l.begin(), l.end());
    return out;
  };
  const auto x = ops(*split), y = ops(whole);
  const double d = rel_maxdiff(x, y);
  EXPECT_LE(d, kTol);
  // the restored sequence's row equals its source's
  EXPECT_EQ(std::vector<float>(x.end() - 4 * V, x.end() - 3 * V), std::vector<float>(x.end() - V, x.end()));
  std::printf("sequences, tentative rows, snapshots at 2 ranks: max |dlogit| / RMS = %.2e\n", d);
}
