// Test support: MTP steps through the seam (backend/backend.h, Step::mtp) the way the generation loop
// issues them, for any backend: teacher-forced rows after prompt chunks, and greedy draft chains.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "model/qwen_hybrid.h"
#include "tools/synth.h"

namespace lily::test_support {

// The `tiny` synth model (with its MTP block) in format f, EXL3 at 3 bits.
inline std::shared_ptr<const ModelWeights> tiny_mtp_synth(SynthFormat f, uint64_t seed = 1) {
  SynthOptions so;
  so.preset = "tiny";
  so.format = f;
  so.exl3_bits = 3;
  so.seed = seed;
  return synth_model(so);
}

// Teacher-forced MTP logits [T-1, V] through the seam: the prompt in main chunks of `chunk` rows that keep
// their hidden rows; after each chunk the pairs (x_{t+1}, h_t) of its rows go through MTP steps of at
// most `piece` rows.
inline std::vector<float> mtp_rows_via_steps(Backend& be, SequenceState& st, const std::vector<int32_t>& ids, int64_t chunk,
                                      int64_t piece, int32_t head_vocab = 0) {
  const int64_t T = int64_t(ids.size()), V = be.weights().cfg.vocab;
  std::vector<float> out;
  for (int64_t p0 = 0; p0 < T; p0 += chunk) {
    const int64_t m = std::min(chunk, T - p0);
    Step main;
    main.add(st, std::span(ids).subspan(size_t(p0), size_t(m)), 0, false);
    main.groups[0].keep_hidden = true;
    be.finish(forward(be, main), StepOutputs{});
    EXPECT_EQ(st.hidden_rows(), m);
    const int64_t pairs = std::min(p0 + m, T - 1) - p0;  // t in [p0, p0 + pairs)
    for (int64_t b = 0; b < pairs; b += piece) {
      const int64_t n = std::min(piece, pairs - b);
      std::vector<int32_t> toks(ids.begin() + p0 + b + 1, ids.begin() + p0 + b + 1 + n), hid;
      for (int64_t i = 0; i < n; ++i) hid.push_back(int32_t(b + i));
      Step s;
      s.add_mtp(st, toks, hid, int32_t(n));
      s.head_vocab = head_vocab;
      std::vector<float> l(size_t(n * V));
      be.finish(forward(be, s), StepOutputs{l.data(), nullptr});
      out.insert(out.end(), l.begin(), l.end());
    }
  }
  EXPECT_EQ(st.mtp_tokens(), T - 1);
  return out;
}

// Prefills all of ids but the last (kept hidden rows) and returns the catch-up MTP rows of the pairs
// (ids[t + 1], h_t): their tokens and hidden inputs.
inline std::pair<std::vector<int32_t>, std::vector<int32_t>> prefill_keeping(Backend& be, SequenceState& st,
                                                                             const std::vector<int32_t>& ids) {
  const int64_t P = int64_t(ids.size()) - 1;
  Step main;
  main.add(st, std::span(ids).first(size_t(P)), 0, false);
  main.groups[0].keep_hidden = true;
  be.finish(forward(be, main), StepOutputs{});
  std::vector<int32_t> toks(ids.begin() + 1, ids.end()), hid;
  for (int64_t i = 0; i < P; ++i) hid.push_back(int32_t(i));
  return {toks, hid};
}

// The greedy MTP draft of `depth` tokens after ids (its last token not yet in the main state, as in a
// decode round) through the seam: main prefill keeping hidden rows, the catch-up pairs and the first draft
// row in one MTP step, then chain rows reading kMtpHidden. The MTP cache is truncated back afterwards.
inline std::vector<int32_t> draft_via_steps(Backend& be, SequenceState& st, const std::vector<int32_t>& ids, int depth) {
  const int64_t V = be.weights().cfg.vocab;
  const int64_t P = int64_t(ids.size()) - 1;  // prefilled
  const auto [toks, hid] = prefill_keeping(be, st, ids);
  std::vector<int32_t> draft;
  std::vector<float> l(static_cast<size_t>(V));
  for (int d = 0; d < depth; ++d) {
    Step s;
    if (d == 0) s.add_mtp(st, toks, hid, 1);
    else s.add_mtp(st, std::span(&draft.back(), 1), std::span(&kMtpHidden, 1), 1);
    be.finish(forward(be, s), StepOutputs{l.data(), nullptr});
    draft.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));  // lowest id on ties
  }
  EXPECT_EQ(st.mtp_tokens(), P + depth - 1);
  st.truncate_mtp(P);
  return draft;
}

// The logits of a draft chain with given drafts: the first draft row after ids (as draft_via_steps), then
// chain rows (chain[j], h') for every j; [chain.size() + 1, V]. The MTP cache is truncated back.
inline std::vector<float> chain_logits(Backend& be, SequenceState& st, const std::vector<int32_t>& ids,
                                       const std::vector<int32_t>& chain) {
  const int64_t V = be.weights().cfg.vocab, P = int64_t(ids.size()) - 1;
  const auto [toks, hid] = prefill_keeping(be, st, ids);
  std::vector<float> out(size_t(int64_t(chain.size() + 1) * V));
  for (size_t d = 0; d <= chain.size(); ++d) {
    Step s;
    if (d == 0) s.add_mtp(st, toks, hid, 1);
    else s.add_mtp(st, std::span(&chain[d - 1], 1), std::span(&kMtpHidden, 1), 1);
    be.finish(forward(be, s), StepOutputs{out.data() + int64_t(d) * V, nullptr});
  }
  st.truncate_mtp(P);
  return out;
}

// Sequences with prompts `ids` (each prefilled with kept hidden rows), then three MTP steps: the catch-up
// rows of every pair plus one more row each, then two chain rows through h'; all sequences in one step per
// depth (together) or each in its own steps. The logits rows in order of (depth, sequence).
inline std::vector<float> mtp_rows_batched(Backend& be, const std::vector<std::vector<int32_t>>& ids, bool together) {
  const int64_t V = be.weights().cfg.vocab;
  const size_t S = ids.size();
  std::vector<std::unique_ptr<SequenceState>> sts;
  for (size_t i = 0; i < S; ++i) {
    sts.push_back(be.new_state(64));
    Step m;
    m.add(*sts.back(), ids[i], 1);
    m.groups[0].keep_hidden = true;
    std::vector<float> l(static_cast<size_t>(V));
    be.finish(forward(be, m), StepOutputs{l.data(), nullptr});
  }
  std::vector<float> all;
  for (int depth = 0; depth < 3; ++depth) {
    std::vector<Step> steps(together ? 1 : S);
    for (size_t i = 0; i < S; ++i) {
      Step& s = steps[together ? 0 : i];
      const auto& x = ids[i];
      if (depth == 0) {
        std::vector<int32_t> toks(x.begin() + 1, x.end()), hid;
        toks.push_back(int32_t(i));
        for (size_t r = 0; r < x.size(); ++r) hid.push_back(int32_t(r));
        s.add_mtp(*sts[i], toks, hid, 2);
      } else {
        const int32_t t = int32_t(depth + int(i));
        s.add_mtp(*sts[i], std::span(&t, 1), std::span(&kMtpHidden, 1), 1);
      }
    }
    for (Step& s : steps) {
      std::vector<float> l(size_t(s.logit_rows() * V));
      be.finish(forward(be, s), StepOutputs{l.data(), nullptr});
      all.insert(all.end(), l.begin(), l.end());
    }
  }
  return all;
}

// A tentative main step of 4 rows keeping its hidden rows on `a`, then commit(2), against the same first 2
// rows stepped plainly (keeping theirs) on `b`, a sequence in the same state: the logits of the MTP pair of
// those two rows on each ({a's, b's}). Checks the kept-row counts and that a pair reading past the 2 rows
// kept after the commit is refused.
inline std::pair<std::vector<float>, std::vector<float>> mtp_after_commit(Backend& be, SequenceState& a, SequenceState& b) {
  const int64_t V = be.weights().cfg.vocab;
  const int32_t t4[4] = {1, 2, 3, 4};
  Step ten;
  ten.add(a, t4, 4, true, false, true);
  ten.groups[0].keep_hidden = true;
  std::vector<float> l(size_t(4 * V));
  be.finish(forward(be, ten), StepOutputs{l.data(), nullptr});
  EXPECT_EQ(a.hidden_rows(), 4);
  a.commit(2);
  EXPECT_EQ(a.hidden_rows(), 2);
  const int32_t x2[2] = {2, 3}, h_ok[2] = {0, 1}, h_bad[2] = {1, 2};
  {
    Step s;
    s.add_mtp(a, x2, h_bad, 1);
    EXPECT_THROW(forward(be, s), InternalError);
  }
  Step plain;
  plain.add(b, std::span(t4, 2), 0, false);
  plain.groups[0].keep_hidden = true;
  be.finish(forward(be, plain), StepOutputs{});
  std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
  for (auto [st, out] : {std::pair{&a, &la}, std::pair{&b, &lb}}) {
    Step s;
    s.add_mtp(*st, x2, h_ok, 1);
    be.finish(forward(be, s), StepOutputs{out->data(), nullptr});
  }
  return {la, lb};
}

// MTP logits rows [rows, V] with a draft head of n ids (Step::head_vocab) against the same rows with every id:
// ids below n within tol·RMS of the full row, the rest -inf; `cut` false (a head the backend cannot cut, EXL3):
// every id as the full row.
inline void expect_draft_head(const std::vector<float>& full, const std::vector<float>& part, int64_t V, int64_t n,
                              bool cut, double tol, const std::string& what) {
  ASSERT_EQ(full.size(), part.size()) << what;
  for (size_t r = 0; r < full.size() / size_t(V); ++r) {
    const float* f = full.data() + r * size_t(V);
    const float* p = part.data() + r * size_t(V);
    double ss = 0, worst = 0;
    for (int64_t i = 0; i < V; ++i) ss += double(f[i]) * f[i];
    const double rms = std::sqrt(ss / double(V));
    int64_t bad_tail = 0;
    for (int64_t i = 0; i < V; ++i) {
      if (cut && i >= n) {
        bad_tail += !(std::isinf(p[i]) && p[i] < 0);
        continue;
      }
      worst = std::max(worst, std::fabs(double(p[i]) - f[i]) / rms);
    }
    EXPECT_LE(worst, tol) << what << " row " << r;
    EXPECT_EQ(bad_tail, 0) << what << " row " << r << ": ids past the draft head are not -inf";
  }
}

}  // namespace lily::test_support
