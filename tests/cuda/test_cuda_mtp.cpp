// The MTP step (Step::mtp) on the CUDA backend against the CPU backend and the golden MTP logits: teacher-
// forced rows absorbed beside prompt chunks of awkward sizes (GEMM and GEMV paths, prompt and decode
// attention over the MTP KV cache), draft chains through h', the MTP block in every weight format the
// synth models come in, several sequences in one MTP step, the MTP cache through truncation, snapshots,
// tentative steps with commit, and the refusals.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaMtp, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "../support/mtp_steps.h"
#include "backend/cpu/cpu_backend.h"
#include "core/mapped_file.h"
#include "step_harness.h"
#include "tools/synth.h"

using namespace lily;
using namespace lily::cudatest;
using test_support::chain_logits;
using test_support::draft_via_steps;
using test_support::mtp_rows_via_steps;

namespace {

// The goldens with an MTP block present here (the dense one lives beside the repository).
std::vector<std::string> mtp_goldens() {
  std::vector<std::string> v;
  for (const char* n : {"qwen3_5_moe_text-a-mtp", "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"})
    if (!test::golden_dir(n).empty()) v.push_back(n);
  return v;
}

// The first of them (tests/data/golden holds two).
std::shared_ptr<ModelWeights> first_mtp_golden() {
  const auto names = mtp_goldens();
  if (names.empty()) throw InputError("no golden model with an MTP block found");
  return ModelWeights::load(test::golden_dir(names.front()));
}

// A golden model, its golden.json and prompt.
struct MtpGolden {
  std::shared_ptr<ModelWeights> w;
  nlohmann::json j;
  std::vector<int32_t> prompt;
};
MtpGolden load_mtp_golden(const std::string& name) {
  const std::string dir = test::golden_dir(name);
  auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
  auto prompt = j["prompt_ids"].get<std::vector<int32_t>>();
  return {ModelWeights::load(dir), std::move(j), std::move(prompt)};
}

void print_agreement(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, int64_t V) {
  const Agreement a = agreement(got.data(), want.data(), int64_t(want.size()) / V, V);
  std::printf("[%s] top-1 %.4f (up to near-ties %.4f), max|dlogit| %.3g (%.3g without the worst 1%% of rows), RMS %.3g\n",
              what.c_str(), a.top1, a.top1_ties, a.max_abs, a.max_abs_99, a.rms);
}

// Greedy ids of the CUDA backend against the CPU's: equal, or first different at a near-tie of the CPU
// logits (`cpu_rows(j)`: the CPU's logits at position j given the CUDA ids before it).
template <class F>
void expect_same_greedy(const std::vector<int32_t>& gpu, const std::vector<int32_t>& cpu, int64_t V, F&& cpu_rows,
                        const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t j = 0; j < gpu.size(); ++j) {
    if (gpu[j] == cpu[j]) continue;
    const std::vector<float> l = cpu_rows(j);
    ASSERT_EQ(int64_t(l.size()), V);
    double ss = 0;
    for (float x : l) ss += double(x) * x;
    const double rms = std::sqrt(ss / double(V)), gap = double(*std::max_element(l.begin(), l.end())) - l[size_t(gpu[j])];
    EXPECT_LE(gap, 1e-2 * std::max(1.0, rms)) << what << ": position " << j << " CUDA " << gpu[j] << " CPU " << cpu[j];
    std::printf("[%s] position %zu: a near-tie (CPU logit gap %.3g) decided otherwise\n", what.c_str(), j, gap);
    return;  // the chains continue from different tokens
  }
}

TEST(CudaMtp, TeacherForcedLogitsMatchCpuAndGolden) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string& name : mtp_goldens()) {
    SCOPED_TRACE(name);
    const auto [w, j, prompt] = load_mtp_golden(name);
    const int64_t V = w->cfg.vocab;
    const auto golden = test::read_f32(test::golden_dir(name) + "/mtp_logits.f32");
    cpu::CpuBackend cpu(w);
    auto gpu = make_cuda_backend(w);
    auto sc = cpu.new_state(256);
    const auto ref = mtp_rows_via_steps(cpu, *sc, prompt, 2048, 2048);
    ASSERT_EQ(golden.size(), ref.size());
    for (auto [chunk, piece] : {std::pair<int64_t, int64_t>{150, 150}, {37, 5}, {1, 1}, {64, 7}, {150, 2}}) {
      const std::string w_ = name + " chunk " + std::to_string(chunk) + " piece " + std::to_string(piece);
      auto sg = gpu->new_state(256);
      const auto got = mtp_rows_via_steps(*gpu, *sg, prompt, chunk, piece);
      expect_agree(got, ref, V, w_ + " vs CPU");
      expect_agree(got, golden, V, w_ + " vs golden");
      print_agreement(w_ + " vs CPU", got, ref, V);
    }
  }
}

TEST(CudaMtp, DraftChainsMatchCpuAndGolden) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string& name : mtp_goldens()) {
    SCOPED_TRACE(name);
    const auto [w, j, prompt] = load_mtp_golden(name);
    const int64_t V = w->cfg.vocab;
    const auto chain = j["mtp"]["chain"].get<std::vector<int32_t>>();
    std::vector<int32_t> ids(prompt.begin(), prompt.begin() + j["mtp"]["chain_prefix_len"].get<int64_t>());
    ids.push_back(j["greedy_ids"][0].get<int32_t>());
    cpu::CpuBackend cpu(w);
    auto gpu = make_cuda_backend(w);
    auto cpu_rows = [&](const std::vector<int32_t>& drafts) {
      return [&, drafts](size_t at) {
        auto st = cpu.new_state(256);
        const auto l = chain_logits(cpu, *st, ids, std::vector<int32_t>(drafts.begin(), drafts.begin() + std::ptrdiff_t(at)));
        return std::vector<float>(l.end() - V, l.end());
      };
    };
    for (int depth : {1, int(chain.size()), 6}) {
      auto sg = gpu->new_state(256), sc = cpu.new_state(256);
      const auto dg = draft_via_steps(*gpu, *sg, ids, depth), dc = draft_via_steps(cpu, *sc, ids, depth);
      EXPECT_EQ(sg->mtp_tokens(), int64_t(ids.size()) - 1) << "the chain rows left the MTP cache";
      expect_same_greedy(dg, dc, V, cpu_rows(dg), name + " depth " + std::to_string(depth) + " vs CPU");
      if (depth == int(chain.size())) expect_same_greedy(dg, chain, V, cpu_rows(dg), name + " vs the golden chain");
    }
    // the chain's logits row by row (decode paths, h' through the slot)
    auto sg = gpu->new_state(256), sc = cpu.new_state(256);
    expect_agree(chain_logits(*gpu, *sg, ids, chain), chain_logits(cpu, *sc, ids, chain), V, name + " chain logits");
  }
}

// MTP groups that ask for ids get the argmax of their rows, drawn on the device (no sampler set, the
// sequence's fed id untouched): the ids equal the argmax of the same rows' logits.
TEST(CudaMtp, DeviceArgmaxOfMtpRows) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto w = first_mtp_golden();
  auto gpu = make_cuda_backend(w);
  const int64_t V = w->cfg.vocab;
  const std::vector<std::vector<int32_t>> ids = {test::random_ids(9, V, 3u), test::random_ids(23, V, 4u)};
  std::vector<int32_t> want, got;
  for (bool draw : {false, true}) {
    std::vector<std::unique_ptr<SequenceState>> sts;
    Step s;
    std::vector<std::vector<int32_t>> toks(ids.size()), hid(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      sts.push_back(gpu->new_state(64));
      std::tie(toks[i], hid[i]) = test_support::prefill_keeping(*gpu, *sts.back(), ids[i]);
      s.add_mtp(*sts.back(), toks[i], hid[i], int32_t(i + 1), !draw, draw);  // 1 and 2 output rows
    }
    std::vector<float> l(size_t(s.logit_rows() * V));
    std::vector<int32_t> d(size_t(s.sample_rows()));
    gpu->finish(forward(*gpu, s), StepOutputs{draw ? nullptr : l.data(), draw ? d.data() : nullptr});
    if (draw) got = d;
    else
      for (int64_t r = 0; r < s.logit_rows(); ++r) want.push_back(int32_t(argmax_row(l.data() + r * V, V)));
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(got.size(), 3u);
}

// A draft head over ids [0, n) (Step::head_vocab): logits rows as the full head's for ids below n and -inf
// past them (bf16 and affine heads; an EXL3 head is not cut), and the device argmax among the first n ids.
TEST(CudaMtp, DraftHeadCoversAPrefixOfTheVocabulary) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (SynthFormat f : {SynthFormat::BF16, SynthFormat::Affine4, SynthFormat::Exl3}) {
    SCOPED_TRACE(synth_format_name(f));
    const auto w = test_support::tiny_mtp_synth(f, 12);
    auto gpu = make_cuda_backend(w);
    const int64_t V = w->cfg.vocab;
    const auto ids = test::random_ids(30, V, 8u);
    auto a = gpu->new_state(64);
    const auto full = mtp_rows_via_steps(*gpu, *a, ids, 11, 5);
    for (int64_t n : {int64_t(1), int64_t(257), V / 3, V - 1}) {
      auto st = gpu->new_state(64);
      const auto part = mtp_rows_via_steps(*gpu, *st, ids, 11, 5, int32_t(n));
      test_support::expect_draft_head(full, part, V, n, f != SynthFormat::Exl3, 1e-4,
                                      std::string(synth_format_name(f)) + " n " + std::to_string(n));
      // the device argmax of a draft row against the argmax of the host row
      auto d = gpu->new_state(64);
      const auto [toks, hid] = test_support::prefill_keeping(*gpu, *d, ids);
      Step s;
      s.add_mtp(*d, toks, hid, 1, false, true);
      s.head_vocab = int32_t(n);
      int32_t id = -1;
      gpu->finish(forward(*gpu, s), StepOutputs{nullptr, &id});
      const float* last = part.data() + (part.size() / size_t(V) - 1) * size_t(V);
      ASSERT_TRUE(id >= 0 && id < V) << "n " << n;
      const float mx = last[argmax_row(last, V)];
      EXPECT_NEAR(last[id], mx, 1e-3 * (1.0 + std::fabs(mx))) << "n " << n << ": not the argmax (up to near-ties)";
      if (f != SynthFormat::Exl3) {
        EXPECT_LT(id, n);
      }
    }
  }
}

// The MTP block in each synth format (bf16, affine 4/8-bit, EXL3): its layer, fc and norms uploaded as the
// main layers are; exact products on the CPU side.
TEST(CudaMtp, EveryWeightFormatMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (SynthFormat f : {SynthFormat::BF16, SynthFormat::Affine4, SynthFormat::Affine8, SynthFormat::Exl3}) {
    SCOPED_TRACE(synth_format_name(f));
    const auto w = test_support::tiny_mtp_synth(f, 11);
    ASSERT_TRUE(w->mtp.has_value());
    cpu::CpuOptions co;
    co.affine = cpu::AffinePath::Exact;
    cpu::CpuBackend cpu(w, co);
    auto gpu = make_cuda_backend(w);
    for (size_t T : {2, 19, 70}) {
      const auto ids = test::random_ids(T, w->cfg.vocab, uint32_t(T));
      auto sc = cpu.new_state(128), sg = gpu->new_state(128);
      const auto ref = mtp_rows_via_steps(cpu, *sc, ids, 17, 6), got = mtp_rows_via_steps(*gpu, *sg, ids, 17, 6);
      const std::string what = std::string(synth_format_name(f)) + " T " + std::to_string(T);
      expect_agree(got, ref, w->cfg.vocab, what);
      print_agreement(what, got, ref, w->cfg.vocab);
    }
  }
}

// An MTP step's rows do not depend on what they are batched with (catch-up rows and chain rows of three
// sequences in one step against each alone).
TEST(CudaMtp, SequencesInOneMtpStepMatchEachAlone) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto w = first_mtp_golden();
  auto gpu = make_cuda_backend(w);
  const int64_t V = w->cfg.vocab;
  const int S = 3;
  std::vector<std::vector<int32_t>> ids;
  for (int i = 0; i < S; ++i) ids.push_back(test::random_ids(size_t(5 + 9 * i), V, uint32_t(40 + i)));
  const auto alone = test_support::mtp_rows_batched(*gpu, ids, false),
             together = test_support::mtp_rows_batched(*gpu, ids, true);
  expect_agree(together, alone, V, "together vs alone");
  print_agreement("MTP step: together vs alone", together, alone, V);
}

// The MTP KV cache through truncation, snapshots (exact, into another slot; the CPU's layout) and reset; a
// tentative main step keeping its hidden rows, then commit(n), keeps n of them.
TEST(CudaMtp, MtpCacheThroughTruncateSnapshotAndCommit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto w = first_mtp_golden();
  auto gpu = make_cuda_backend(w);
  cpu::CpuBackend cpu(w);
  const int64_t V = w->cfg.vocab;
  const auto ids = test::random_ids(30, V, 5);
  auto a = gpu->new_state(64), c = cpu.new_state(64);
  a->reserve_tentative(4);
  mtp_rows_via_steps(*gpu, *a, ids, 11, 4);
  mtp_rows_via_steps(cpu, *c, ids, 11, 4);
  EXPECT_EQ(a->mtp_tokens(), 29);
  auto snap = a->snapshot();
  expect_state_near(snap->contents(), c->snapshot()->contents(), "snapshot vs the CPU's (MTP KV rows included)");
  auto b = gpu->new_state(64);
  b->restore(*snap);
  EXPECT_EQ(b->mtp_tokens(), 29);
  EXPECT_EQ(b->hidden_rows(), 0) << "a restored sequence keeps no hidden rows";
  EXPECT_EQ(b->snapshot()->contents(), snap->contents());
  {  // a restored sequence has no h' to chain from
    const int32_t t = 1;
    Step s;
    s.add_mtp(*b, std::span(&t, 1), std::span(&kMtpHidden, 1), 1);
    EXPECT_THROW(forward(*gpu, s), InternalError);
  }
  // a tentative main step keeping its rows, commit(2): the pairs of the two rows match a plain copy's
  const auto [la, lb] = test_support::mtp_after_commit(*gpu, *a, *b);
  expect_agree(la, lb, V, "tentative rows kept then commit(2) vs two plain rows");
  expect_state_near(a->snapshot()->contents(), b->snapshot()->contents(), "state after the MTP rows");
  EXPECT_EQ(a->mtp_tokens(), 31);
  a->truncate_mtp(29);
  EXPECT_EQ(a->mtp_tokens(), 29);
  EXPECT_THROW(a->truncate_mtp(30), InternalError);
  // a main step without keep_hidden drops the kept rows
  const int32_t one = 5;
  forward_step(*gpu, *a, std::span(&one, 1), 0, nullptr);
  EXPECT_EQ(a->hidden_rows(), 0);
  a->reset();
  EXPECT_EQ(a->mtp_tokens(), 0);
  EXPECT_EQ(a->hidden_rows(), 0);
}

TEST(CudaMtp, BadInputIsRefusedWithItsCause) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto refused = [](Backend& be, const Step& st, const std::string& what) {
    try {
      be.finish(forward(be, st), StepOutputs{});
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const int32_t t[3] = {1, 2, 3}, h0[3] = {0, 1, 2};
  {
    auto w = ModelWeights::load(test::golden_dir("qwen3_next-a"));  // no MTP block
    auto gpu = make_cuda_backend(w);
    auto st = gpu->new_state(8);
    Step s;
    s.add_mtp(*st, std::span(t, 1), std::span(&kMtpHidden, 1), 1);
    refused(*gpu, s, "mtp.fc");
    Step m;
    m.add(*st, t, 0, false);
    m.groups[0].keep_hidden = true;
    refused(*gpu, m, "no MTP block");
  }
  auto w = first_mtp_golden();
  auto gpu = make_cuda_backend(w);
  auto st = gpu->new_state(8);
  {
    Step s;
    s.add_mtp(*st, std::span(t, 1), std::span(&kMtpHidden, 1), 1);
    refused(*gpu, s, "ran no MTP step");
  }
  {
    Step s;
    s.add_mtp(*st, std::span(t, 1), std::span(h0, 1), 1);
    refused(*gpu, s, "kept 0");
  }
  Step m;
  m.add(*st, t, 0, false);
  m.groups[0].keep_hidden = true;
  gpu->finish(forward(*gpu, m), StepOutputs{});
  {
    const int32_t hb[2] = {0, kMtpHidden};
    Step s;
    s.add_mtp(*st, std::span(t, 2), hb, 1);
    refused(*gpu, s, "not the group's first row");
  }
  {
    auto small = gpu->new_state(2);
    Step mm;
    mm.add(*small, std::span(t, 2), 0, false);
    mm.groups[0].keep_hidden = true;
    gpu->finish(forward(*gpu, mm), StepOutputs{});
    Step s;
    s.add_mtp(*small, std::span(t, 2), std::span(h0, 2), 1);
    gpu->finish(forward(*gpu, s), StepOutputs{nullptr, nullptr});
    Step more;
    more.add_mtp(*small, std::span(t, 1), std::span(&kMtpHidden, 1), 1);
    refused(*gpu, more, "exceed the context size");
  }
  // the backend still steps after the refusals
  std::vector<float> l(static_cast<size_t>(w->cfg.vocab));
  Step s;
  s.add_mtp(*st, t, h0, 1);
  gpu->finish(forward(*gpu, s), StepOutputs{l.data(), nullptr});
  EXPECT_EQ(st->mtp_tokens(), 3);
}

}  // namespace
#endif
