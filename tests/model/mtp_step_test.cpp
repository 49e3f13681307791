// The MTP step at the seam (Step::mtp, backend/backend.h) on the CPU backend against the plain reference
// (backend/cpu/mtp_reference.h) and the golden MTP logits and draft chains: teacher-forced rows absorbed in
// awkward pieces beside prompt chunks of awkward sizes, draft chains through kMtpHidden, several sequences
// in one MTP step, the MTP KV cache through truncation, commit and snapshots, and the bad-input checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/mtp_reference.h"
#include "core/mapped_file.h"
#include "model/qwen_hybrid.h"
#include "../support/mtp_steps.h"
#include "test_util.h"
#include "tools/synth.h"

using namespace lily;

namespace {

const char* const kMtpGoldens[] = {"qwen3_5_moe_text-a-mtp", "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"};

using test::random_ids;

using test::rel_maxdiff;

using test_support::draft_via_steps;
using test_support::mtp_rows_via_steps;

TEST(MtpStep, TeacherForcedRowsMatchTheReferenceAndGolden) {
  for (const char* name : kMtpGoldens) {
    SCOPED_TRACE(name);
    const std::string dir = test::golden_dir(name);
    ASSERT_FALSE(dir.empty());
    auto w = ModelWeights::load(dir);
    auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
    const auto prompt = j["prompt_ids"].get<std::vector<int32_t>>();
    const auto golden = test::read_f32(dir + "/mtp_logits.f32");
    cpu::CpuBackend be(w);
    auto st0 = be.new_state(256);
    const auto h = cpu::final_hidden_states(be, *st0, prompt, 2048, nullptr);
    const auto ref = cpu::mtp_teacher_forced(*w, prompt, h.data());
    for (auto [chunk, piece] : {std::pair<int64_t, int64_t>{2048, 2048}, {37, 5}, {1, 1}, {64, 7}, {150, 149}}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + " piece " + std::to_string(piece));
      auto st = be.new_state(256);
      const auto got = mtp_rows_via_steps(be, *st, prompt, chunk, piece);
      const double dr = rel_maxdiff(got, ref), dg = rel_maxdiff(got, golden);
      EXPECT_LE(dr, 1e-3) << "vs the reference";
      EXPECT_LE(dg, 1e-3) << "vs the golden";
      std::printf("%s chunk %lld piece %lld: max|d|/RMS %.2e vs reference, %.2e vs golden\n", name, (long long)chunk,
                  (long long)piece, dr, dg);
    }
  }
}

TEST(MtpStep, DraftChainMatchesTheGoldenAndTheReference) {
  for (const char* name : kMtpGoldens) {
    SCOPED_TRACE(name);
    const std::string dir = test::golden_dir(name);
    auto w = ModelWeights::load(dir);
    auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
    const auto prompt = j["prompt_ids"].get<std::vector<int32_t>>();
    const auto chain = j["mtp"]["chain"].get<std::vector<int32_t>>();
    const int64_t prefix = j["mtp"]["chain_prefix_len"].get<int64_t>();
    std::vector<int32_t> ids(prompt.begin(), prompt.begin() + prefix);
    ids.push_back(j["greedy_ids"][0].get<int32_t>());
    cpu::CpuBackend be(w);
    auto st = be.new_state(256);
    EXPECT_EQ(draft_via_steps(be, *st, ids, int(chain.size())), chain);
    // deeper chains equal the reference's (which absorbs the same pairs)
    auto st0 = be.new_state(256);
    const auto h = cpu::final_hidden_states(be, *st0, std::span(ids).first(ids.size() - 1), 2048, nullptr);
    for (int depth : {1, 6}) {
      auto s = be.new_state(256);
      EXPECT_EQ(draft_via_steps(be, *s, ids, depth), cpu::mtp_greedy_draft(*w, ids, h.data(), depth)) << "depth " << depth;
    }
  }
}

// Quantised synth models (affine 4-bit, EXL3) with awkward prompt lengths, exact products on both sides.
TEST(MtpStep, QuantisedSynthModelsMatchTheReference) {
  for (SynthFormat f : {SynthFormat::Affine4, SynthFormat::Exl3}) {
    SCOPED_TRACE(synth_format_name(f));
    const auto w = test_support::tiny_mtp_synth(f);
    ASSERT_TRUE(w->mtp.has_value());
    cpu::CpuOptions co;
    co.affine = cpu::AffinePath::Exact;
    cpu::CpuBackend be(w, co);
    for (size_t T : {2, 19, 70}) {
      const auto ids = random_ids(T, w->cfg.vocab, uint32_t(T));
      auto st0 = be.new_state(128);
      const auto h = cpu::final_hidden_states(be, *st0, ids, 2048, nullptr);
      const auto ref = cpu::mtp_teacher_forced(*w, ids, h.data(), cpu::AffinePath::Exact);
      auto st = be.new_state(128);
      const auto got = mtp_rows_via_steps(be, *st, ids, 17, 6);
      EXPECT_LE(rel_maxdiff(got, ref), 1e-3) << "T " << T;
    }
  }
}

// A draft head over ids [0, n) (Step::head_vocab): the goldens (bf16 heads) and the affine synth give the full
// rows' first n logits and -inf past them; the EXL3 synth's head is not cut (every id, as the full rows).
TEST(MtpStep, DraftHeadCoversAPrefixOfTheVocabulary) {
  struct Case {
    std::string name;
    std::shared_ptr<const ModelWeights> w;
    bool cut;
  };
  std::vector<Case> cases;
  for (const char* name : kMtpGoldens) cases.push_back({name, ModelWeights::load(test::golden_dir(name)), true});
  cases.push_back({"affine4 synth", test_support::tiny_mtp_synth(SynthFormat::Affine4), true});
  cases.push_back({"exl3 synth", test_support::tiny_mtp_synth(SynthFormat::Exl3), false});
  for (const Case& c : cases) {
    cpu::CpuBackend be(c.w);
    const int64_t V = c.w->cfg.vocab;
    const auto ids = random_ids(23, V, 5u);
    auto a = be.new_state(64), b = be.new_state(64);
    const auto full = mtp_rows_via_steps(be, *a, ids, 9, 4);
    for (int64_t n : {int64_t(1), V / 3, V - 1, V}) {
      auto st = be.new_state(64);
      const auto part = mtp_rows_via_steps(be, *st, ids, 9, 4, int32_t(n));
      test_support::expect_draft_head(full, part, V, n, c.cut, 1e-5, c.name + " n " + std::to_string(n));
    }
  }
}

// An MTP step's rows do not depend on what they are batched with: bit for bit.
TEST(MtpStep, SequencesInOneMtpStepMatchEachAlone) {
  auto w = ModelWeights::load(test::golden_dir("qwen3_next-a-mtp"));
  cpu::CpuBackend be(w);
  const int64_t V = w->cfg.vocab;
  const int S = 3;
  std::vector<std::vector<int32_t>> ids;
  for (int i = 0; i < S; ++i) ids.push_back(random_ids(size_t(5 + 9 * i), V, uint32_t(40 + i)));
  const auto a = test_support::mtp_rows_batched(be, ids, false), b = test_support::mtp_rows_batched(be, ids, true);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

// The MTP KV cache: truncation, snapshots (restored exactly, into another slot), reset; a tentative main
// step keeping hidden rows then commit(n) keeps n of them.
TEST(MtpStep, MtpCacheThroughTruncateSnapshotAndCommit) {
  auto w = ModelWeights::load(test::golden_dir("qwen3_5_moe_text-a-mtp"));
  cpu::CpuBackend be(w);
  const int64_t V = w->cfg.vocab;
  const auto ids = random_ids(30, V, 5);
  auto a = be.new_state(64);
  a->reserve_tentative(4);
  mtp_rows_via_steps(be, *a, ids, 11, 4);
  EXPECT_EQ(a->mtp_tokens(), 29);
  auto snap = a->snapshot();
  auto b = be.new_state(64);
  b->restore(*snap);
  EXPECT_EQ(b->mtp_tokens(), 29);
  EXPECT_EQ(b->hidden_rows(), 0) << "a restored sequence keeps no hidden rows";
  EXPECT_EQ(b->snapshot()->contents(), snap->contents());
  // a tentative main step keeping its rows, commit(2): the pairs of the two rows equal a plain copy's
  const auto [la, lb] = test_support::mtp_after_commit(be, *a, *b);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(a->mtp_tokens(), 31);
  a->truncate_mtp(29);
  EXPECT_EQ(a->mtp_tokens(), 29);
  EXPECT_THROW(a->truncate_mtp(30), InternalError);
  a->reset();
  EXPECT_EQ(a->mtp_tokens(), 0);
  EXPECT_EQ(a->hidden_rows(), 0);
}

TEST(MtpStep, BadInputIsRefusedWithItsCause) {
  auto refused = [](Backend& be, const Step& st, const std::string& what) {
    try {
      forward(be, st);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  {
    auto w = ModelWeights::load(test::golden_dir("qwen3_next-a"));  // no MTP block
    cpu::CpuBackend be(w);
    auto st = be.new_state(8);
    Step s;
    const int32_t t = 1;
    s.add_mtp(*st, std::span(&t, 1), std::span(&kMtpHidden, 1), 1);
    refused(be, s, "mtp.fc");
  }
  auto w = ModelWeights::load(test::golden_dir("qwen3_5_moe_text-a-mtp"));
  cpu::CpuBackend be(w);
  auto st = be.new_state(8);
  const int32_t t[3] = {1, 2, 3}, h0[3] = {0, 1, 2};
  {
    Step s;
    s.add_mtp(*st, std::span(t, 1), std::span(&kMtpHidden, 1), 1);
    refused(be, s, "ran no MTP step");
  }
  {
    Step s;
    s.add_mtp(*st, std::span(t, 1), std::span(h0, 1), 1);
    refused(be, s, "kept 0");
  }
  Step m;
  m.add(*st, t, 0, false);
  m.groups[0].keep_hidden = true;
  be.finish(forward(be, m), StepOutputs{});
  {
    const int32_t hb[2] = {0, kMtpHidden};
    Step s;
    s.add_mtp(*st, std::span(t, 2), hb, 1);
    refused(be, s, "not the group's first row");
  }
  {
    Step s;
    s.add_mtp(*st, t, h0, 1);
    s.groups[0].tentative = true;
    refused(be, s, "cannot be tentative");
  }
  {
    Step s;
    s.add_mtp(*st, t, h0, 1);
    s.hidden.pop_back();
    refused(be, s, "hidden inputs for");
  }
  {
    auto small = be.new_state(2);
    Step mm;
    mm.add(*small, std::span(t, 2), 0, false);
    mm.groups[0].keep_hidden = true;
    be.finish(forward(be, mm), StepOutputs{});
    Step s;
    s.add_mtp(*small, std::span(t, 2), std::span(h0, 2), 1);
    be.finish(forward(be, s), StepOutputs{nullptr, nullptr});
    Step more;
    more.add_mtp(*small, std::span(t, 1), std::span(&kMtpHidden, 1), 1);
    refused(be, more, "exceed the context size");
  }
}

}  // namespace
