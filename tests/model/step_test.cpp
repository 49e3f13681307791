// Multi-sequence steps on the CPU backend (the seam's contract, backend/backend.h), on the bf16 goldens and
// on affine synth models through the int8 path: sequences stepped together give exactly the logits each
// gives alone; a tentative step of k + 1 rows then commit(n) leaves exactly the state of stepping n rows
// plainly; malformed steps are refused with their cause.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/mapped_file.h"
#include "model/qwen_hybrid.h"
#include "tools/synth.h"
#include "test_util.h"

using namespace lily;

namespace {

const char* const kGoldens[] = {"qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_moe_text-r", "qwen3_5_text-a-mtp"};

std::shared_ptr<const ModelWeights> load(const std::string& name) {
  const std::string dir = test::golden_dir(name);
  return dir.empty() ? nullptr : ModelWeights::load(dir);
}

using test::random_ids;

// fn(backend, weights) for each golden model present (bf16), then for two synth models in affine 4- and 8-bit
// on the int8-activation path (the CPU's default for affine weights: its row kernels and tiles must give a
// row the same bits whatever the rows beside it).
template <typename F>
void for_each_model(F fn) {
  for (const char* name : kGoldens) {
    auto w = load(name);
    if (!w) continue;
    SCOPED_TRACE(name);
    cpu::CpuBackend be(w);
    fn(be, *w);
  }
  for (auto [preset, format] : {std::pair{"tiny", SynthFormat::Affine4}, std::pair{"tiny-next", SynthFormat::Affine8}}) {
    SynthOptions so;
    so.preset = preset;
    so.format = format;
    std::shared_ptr<const ModelWeights> w = synth_model(so);
    SCOPED_TRACE(std::string("synth ") + preset + " " + synth_format_name(format) + " int8");
    cpu::CpuOptions o;
    o.affine = cpu::AffinePath::Int8;
    cpu::CpuBackend be(w, o);
    fn(be, *w);
  }
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);  // memcmp wants non-null pointers, even for 0 bytes
}

// S sequences with different prompt lengths: stepped alone (prompt, then decode rows) vs. together (one
// step holding every sequence's prompt, then steps holding one decode row of each, then a step mixing a
// new prompt chunk of one with decode rows of the others): the same logits bit for bit.
TEST(Step, SequencesSteppedTogetherMatchEachAlone) {
  for_each_model([](cpu::CpuBackend& be, const ModelWeights& w) {
    const int64_t V = w.cfg.vocab;
    for (int S : {1, 2, 3, 7, 16}) {
      SCOPED_TRACE("S=" + std::to_string(S));
      std::vector<std::vector<int32_t>> prompts, decode, tail;
      for (int i = 0; i < S; ++i) {
        prompts.push_back(random_ids(size_t(1 + (i * 7) % 23 + (i == 0 ? 20 : 0)), V, uint32_t(i)));
        decode.push_back(random_ids(3, V, uint32_t(100 + i)));
        tail.push_back(random_ids(size_t(2 + i % 3), V, uint32_t(200 + i)));
      }
      // alone
      std::vector<std::vector<float>> want(static_cast<size_t>(S));
      for (int i = 0; i < S; ++i) {
        auto st = be.new_state(128);
        std::vector<float> l(static_cast<size_t>(V));
        forward_step(be, *st, prompts[size_t(i)], 1, l.data());
        want[size_t(i)].insert(want[size_t(i)].end(), l.begin(), l.end());
        for (int32_t t : decode[size_t(i)]) {
          forward_step(be, *st, std::span(&t, 1), 1, l.data());
          want[size_t(i)].insert(want[size_t(i)].end(), l.begin(), l.end());
        }
        std::vector<float> lt(tail[size_t(i)].size() * size_t(V));
        forward_step(be, *st, tail[size_t(i)], int64_t(tail[size_t(i)].size()), lt.data());
        want[size_t(i)].insert(want[size_t(i)].end(), lt.begin(), lt.end());
      }
      // together
      std::vector<std::unique_ptr<SequenceState>> sts;
      for (int i = 0; i < S; ++i) sts.push_back(be.new_state(128));
      std::vector<std::vector<float>> got(static_cast<size_t>(S));
      auto run = [&](const Step& st) {
        std::vector<float> out(size_t(st.logit_rows()) * size_t(V));
        be.finish(forward(be, st), StepOutputs{out.data(), nullptr});
        size_t r = 0;
        for (const StepGroup& g : st.groups) {
          const size_t i = size_t(std::find_if(sts.begin(), sts.end(), [&](auto& p) { return p.get() == g.seq; }) - sts.begin());
          got[i].insert(got[i].end(), out.begin() + std::ptrdiff_t(r * size_t(V)),
                        out.begin() + std::ptrdiff_t((r + size_t(g.out_rows)) * size_t(V)));
          r += size_t(g.out_rows);
        }
      };
      {
        Step st;
        for (int i = S - 1; i >= 0; --i) st.add(*sts[size_t(i)], prompts[size_t(i)], 1);  // order differs from the states'
        run(st);
      }
      for (int d = 0; d < 3; ++d) {
        Step st;
        for (int i = 0; i < S; ++i) st.add(*sts[size_t(i)], std::span(&decode[size_t(i)][size_t(d)], 1), 1);
        run(st);
      }
      {
        Step st;  // sequence 0's multi-row chunk beside the others' rows
        for (int i = 0; i < S; ++i) st.add(*sts[size_t(i)], tail[size_t(i)], int32_t(tail[size_t(i)].size()));
        run(st);
      }
      for (int i = 0; i < S; ++i) EXPECT_TRUE(same(got[size_t(i)], want[size_t(i)])) << "sequence " << i;
    }
  });
}

// Raw state: every value of the sequence's in-use state.
std::vector<float> contents(const SequenceState& s) { return s.snapshot()->contents(); }

TEST(Step, TentativeThenCommitEqualsPlainSteps) {
  for_each_model([](cpu::CpuBackend& be, const ModelWeights& w) {
    const int64_t V = w.cfg.vocab;
    const auto prompt = random_ids(37, V, 1);
    const auto probe = random_ids(1, V, 9);
    for (int k = 1; k <= 7; ++k) {
      const auto rows = random_ids(size_t(k + 1), V, uint32_t(10 + k));
      for (int n = 0; n <= k + 1; ++n) {
        SCOPED_TRACE("k=" + std::to_string(k) + " n=" + std::to_string(n));
        // plain: the prompt, then the first n rows
        auto a = be.new_state(64);
        forward_step(be, *a, prompt, 0, nullptr);
        std::vector<float> la(size_t(n) * size_t(V));
        if (n > 0) forward_step(be, *a, std::span(rows).first(size_t(n)), n, la.data());
        // tentative: the prompt, then all k + 1 rows tentatively, commit(n)
        auto b = be.new_state(64);
        b->reserve_tentative(k + 1);
        forward_step(be, *b, prompt, 0, nullptr);
        Step st;
        st.add(*b, rows, k + 1, true, false, true);
        std::vector<float> lb(size_t(k + 1) * size_t(V));
        be.finish(forward(be, st), StepOutputs{lb.data(), nullptr});
        EXPECT_EQ(b->pending(), k + 1);
        EXPECT_EQ(b->n_tokens(), 37);
        b->commit(n);
        EXPECT_EQ(b->pending(), 0);
        ASSERT_EQ(b->n_tokens(), a->n_tokens());
        lb.resize(la.size());
        EXPECT_TRUE(same(la, lb)) << "the accepted rows' logits";
        EXPECT_TRUE(same(contents(*a), contents(*b))) << "the raw state";
        // the next step after the commit
        std::vector<float> na(static_cast<size_t>(V)), nb(static_cast<size_t>(V));
        forward_step(be, *a, probe, 1, na.data());
        forward_step(be, *b, probe, 1, nb.data());
        EXPECT_TRUE(same(na, nb)) << "the next step's logits";
      }
    }
  });
}

TEST(Step, MalformedStepsAreRefusedWithTheirCause) {
  auto w = load("qwen3_5_moe_text-a");
  ASSERT_TRUE(w);
  cpu::CpuBackend be(w), other(w);
  auto a = be.new_state(8), b = other.new_state(8);
  const int32_t t[3] = {1, 2, 3};
  auto refused = [&](const Step& st, const std::string& what) {
    try {
      forward(be, st);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  {
    Step st;
    st.add(*a, t, 1);
    st.add(*a, t, 1);
    refused(st, "appears in an earlier group");
  }
  {
    Step st;
    auto c = be.new_state(2);
    st.add(*c, t, 1);
    refused(st, "exceed the context size");
  }
  {
    Step st;
    st.add(*a, t, 4);
    refused(st, "out_rows 4");
  }
  {
    Step st;
    st.add(*a, t, 1, true, false, true);
    refused(st, "reserved checkpoints for 0");
  }
  {
    Step st;
    const int32_t bad = int32_t(w->cfg.vocab);
    st.add(*a, std::span(&bad, 1), 1);
    refused(st, "outside the vocabulary");
  }
  {
    Step st;
    st.add(*b, t, 1);
    refused(st, "another backend");
  }
  {
    Step st;
    st.add(*a, t, 1, true, true);
    refused(st, "no device sampler");
  }
  a->reserve_tentative(3);
  {
    Step st;
    st.add(*a, t, 3, true, false, true);
    be.finish(forward(be, st), StepOutputs{nullptr, nullptr});
    Step next;
    next.add(*a, t, 1);
    refused(next, "awaiting commit");
    EXPECT_THROW(a->commit(4), InternalError);
    a->commit(2);
    EXPECT_EQ(a->n_tokens(), 2);
  }
  EXPECT_THROW(a->reserve_tentative(kMaxTentativeRows + 1), InternalError);
  EXPECT_THROW(be.finish(12345, StepOutputs{}), InternalError);
}

// Snapshots hold what is in use only and restore into another slot exactly.
TEST(Step, SnapshotsAreCompactAndRestoreExactly) {
  auto w = load("qwen3_next-a");
  ASSERT_TRUE(w);
  cpu::CpuBackend be(w);
  const int64_t V = w->cfg.vocab;
  auto a = be.new_state(4096), b = be.new_state(4096);
  const auto p = random_ids(40, V, 3);
  forward_step(be, *a, p, 0, nullptr);
  auto snap = a->snapshot();
  EXPECT_EQ(snap->n_tokens(), 40);
  EXPECT_LT(snap->nbytes(), a->nbytes() + 1);
  const size_t per_token = size_t(2 * w->cfg.n_kv_heads * w->cfg.head_dim * 4);
  EXPECT_LT(snap->nbytes(), 40 * per_token * size_t(w->cfg.layers) + (size_t(1) << 20)) << "no full-capacity copy";
  b->restore(*snap);
  EXPECT_EQ(b->n_tokens(), 40);
  std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
  const int32_t t = 5;
  forward_step(be, *a, std::span(&t, 1), 1, la.data());
  forward_step(be, *b, std::span(&t, 1), 1, lb.data());
  EXPECT_TRUE(same(la, lb));
  auto small = be.new_state(16);
  EXPECT_THROW(small->restore(*snap), InputError);
}

}  // namespace
