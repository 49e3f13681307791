// Test support: MTP steps through the seam (backend/backend.h, Step::mtp) the way the generation loop
// issues them, for any backend: teacher-forced rows after prompt chunks, and greedy draft chains.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/qwen_hybrid.h"

namespace lily::test_support {

// Teacher-forced MTP logits [T-1, V] through the seam: the prompt in main chunks of `chunk` rows that keep
// their hidden rows; after each chunk the pairs (x_{t+1}, h_t) of its rows go through MTP steps of at
// most `piece` rows.
inline std::vector<float> mtp_rows_via_steps(Backend& be, SequenceState& st, const std::vector<int32_t>& ids, int64_t chunk,
                                      int64_t piece) {
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
      std::vector<float> l(size_t(n * V));
      be.finish(forward(be, s), StepOutputs{l.data(), nullptr});
      out.insert(out.end(), l.begin(), l.end());
    }
  }
  EXPECT_EQ(st.mtp_tokens(), T - 1);
  return out;
}

// The greedy MTP draft of `depth` tokens after ids (its last token not yet in the main state, as in a
// decode round) through the seam: main prefill keeping hidden rows, the catch-up pairs and the first draft
// row in one MTP step, then chain rows reading kMtpHidden. The MTP cache is truncated back afterwards.
inline std::vector<int32_t> draft_via_steps(Backend& be, SequenceState& st, const std::vector<int32_t>& ids, int depth) {
  const int64_t V = be.weights().cfg.vocab;
  const int64_t P = int64_t(ids.size()) - 1;  // prefilled
  Step main;
  main.add(st, std::span(ids).first(size_t(P)), 0, false);
  main.groups[0].keep_hidden = true;
  be.finish(forward(be, main), StepOutputs{});
  std::vector<int32_t> toks(ids.begin() + 1, ids.end()), hid;
  for (int64_t i = 0; i < P; ++i) hid.push_back(int32_t(i));
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
  Step main;
  main.add(st, std::span(ids).first(size_t(P)), 0, false);
  main.groups[0].keep_hidden = true;
  be.finish(forward(be, main), StepOutputs{});
  std::vector<int32_t> toks(ids.begin() + 1, ids.end()), hid;
  for (int64_t i = 0; i < P; ++i) hid.push_back(int32_t(i));
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

}  // namespace lily::test_support
