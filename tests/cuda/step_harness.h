// Shared harness of the multi-sequence step tests: schedules of sequences stepped together or each alone
// through forward(), tentative steps with commit, and the agreement measures of cuda_compare.h.
#pragma once
#ifdef LILY_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cuda_compare.h"
#include "model/qwen_hybrid.h"

namespace lily::cudatest {

// One sequence of a schedule: its prompt enters as one group at step `start`, then one teacher-forced row
// of `feed` per step. Every group asks for the logits of its last row.
struct SeqPlan {
  int start = 0;
  std::vector<int32_t> prompt, feed;
  int steps() const { return 1 + int(feed.size()); }
};

// Pseudo-random ids in [0, V) (a fixed function of the seed).
inline std::vector<int32_t> ids(size_t n, int64_t V, uint32_t seed) {
  std::vector<int32_t> v(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = int32_t((x >> 8) % uint32_t(V));
  }
  return v;
}

// Plans of S sequences with prompts of different lengths (short and long groups: 1 row up to past the
// chunked DeltaNet's 64 and the prompt attention's 8 packed rows) and `feed` decode rows each; starts
// staggered by `stagger` steps (0: all prompts in the first step).
inline std::vector<SeqPlan> make_plans(int S, int64_t V, int feed, int stagger) {
  static const int lens[] = {5, 1, 70, 13, 2, 33, 9, 100, 3, 17, 64, 7, 4, 41, 11, 6};
  std::vector<SeqPlan> p(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) {
    p[size_t(i)].start = stagger * i;
    p[size_t(i)].prompt = ids(size_t(lens[i % 16]), V, 100u + uint32_t(i));
    p[size_t(i)].feed = ids(size_t(feed), V, 500u + uint32_t(i));
  }
  return p;
}

// Runs the schedule: together (every active sequence's group of a step in one Step, in plan order) or each
// sequence alone (its own steps, the same group shapes). Returns per sequence its logits rows [steps][V].
inline std::vector<std::vector<float>> run_schedule(Backend& be, const std::vector<SeqPlan>& plans, bool together) {
  const int64_t V = be.weights().cfg.vocab;
  std::vector<std::unique_ptr<SequenceState>> sts;
  int last = 0;
  for (const SeqPlan& p : plans) {
    sts.push_back(be.new_state(int64_t(p.prompt.size() + p.feed.size()) + 4));
    last = std::max(last, p.start + p.steps());
  }
  std::vector<std::vector<float>> out(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) out[i].resize(size_t(plans[i].steps()) * size_t(V));
  auto group = [&](Step& st, size_t i, int k) {  // step k of sequence i
    const SeqPlan& p = plans[i];
    if (k == 0) st.add(*sts[i], p.prompt, 1);
    else st.add(*sts[i], std::span(p.feed).subspan(size_t(k - 1), 1), 1);
  };
  if (together) {
    for (int s = 0; s < last; ++s) {
      Step st;
      std::vector<std::pair<size_t, int>> who;
      for (size_t i = 0; i < plans.size(); ++i) {
        const int k = s - plans[i].start;
        if (k < 0 || k >= plans[i].steps()) continue;
        group(st, i, k);
        who.push_back({i, k});
      }
      if (who.empty()) continue;
      std::vector<float> l(size_t(st.logit_rows()) * size_t(V));
      be.finish(forward(be, st), StepOutputs{l.data(), nullptr});
      for (size_t j = 0; j < who.size(); ++j)
        std::copy_n(l.begin() + std::ptrdiff_t(j * size_t(V)), V, out[who[j].first].begin() + std::ptrdiff_t(size_t(who[j].second) * size_t(V)));
    }
  } else {
    for (size_t i = 0; i < plans.size(); ++i)
      for (int k = 0; k < plans[i].steps(); ++k) {
        Step st;
        group(st, i, k);
        be.finish(forward(be, st), StepOutputs{out[i].data() + size_t(k) * size_t(V), nullptr});
      }
  }
  return out;
}

// The logits agreement bar of cuda_compare.h (top-1 up to near-ties on every row, max |Δlogit| over all but
// the worst row (or 1%) within 2e-2 of the logit scale: a router near-tie may send one row to another
// expert), with `what` in the messages.
inline void expect_agree(const std::vector<float>& got, const std::vector<float>& want, int64_t V, const std::string& what) {
  const int64_t rows = int64_t(want.size()) / V;
  const Agreement a = agreement(got.data(), want.data(), rows, V);
  EXPECT_GE(a.top1_ties, 0.99) << what;
  EXPECT_LT(a.max_abs_99, 2e-2 * std::max(1.0, a.rms)) << what;
}

// Raw states within the tolerance of the logits bar: max |Δ| <= 2e-2 · max(1, RMS of the reference).
inline void expect_state_near(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double ss = 0, mx = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ss += double(want[i]) * want[i];
    const double d = std::abs(double(got[i]) - want[i]);
    mx = std::isfinite(got[i]) ? std::max(mx, d) : INFINITY;
  }
  const double rms = want.empty() ? 0 : std::sqrt(ss / double(want.size()));
  EXPECT_LE(mx, 2e-2 * std::max(1.0, rms)) << what << " (state RMS " << rms << ")";
}

// Tentative k + 1 rows then commit(n) against n plain rows, for n = 0 .. k + 1: the next step's logits and
// the raw state (StateSnapshot::contents) agree.
inline void check_tentative(Backend& be, const std::vector<int32_t>& prompt, int k, const std::string& what) {
  const int64_t V = be.weights().cfg.vocab;
  const std::vector<int32_t> rows = ids(size_t(k + 1), V, 900u + uint32_t(k));
  const int32_t next = ids(1, V, 77u)[0];
  const int64_t cap = int64_t(prompt.size()) + k + 8;
  for (int n = 0; n <= k + 1; ++n) {
    const std::string w = what + " k " + std::to_string(k) + " n " + std::to_string(n);
    auto a = be.new_state(cap), b = be.new_state(cap);
    a->reserve_tentative(k + 1);
    ASSERT_GE(a->max_tentative(), k + 1) << w;
    forward_step(be, *a, prompt, 0, nullptr);
    forward_step(be, *b, prompt, 0, nullptr);
    {
      Step st;
      st.add(*a, rows, k + 1, true, false, true);
      std::vector<float> l(size_t(k + 1) * size_t(V));
      be.finish(forward(be, st), StepOutputs{l.data(), nullptr});
      EXPECT_EQ(a->pending(), k + 1) << w;
      EXPECT_EQ(a->n_tokens(), int64_t(prompt.size())) << w;
    }
    a->commit(n);
    EXPECT_EQ(a->pending(), 0) << w;
    EXPECT_EQ(a->n_tokens(), int64_t(prompt.size()) + n) << w;
    if (n > 0) forward_step(be, *b, std::span(rows).first(size_t(n)), 0, nullptr);
    expect_state_near(a->snapshot()->contents(), b->snapshot()->contents(), w + " state");
    std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
    forward_step(be, *a, std::span(&next, 1), 1, la.data());
    forward_step(be, *b, std::span(&next, 1), 1, lb.data());
    expect_agree(la, lb, V, w + " next logits");
  }
}

}  // namespace lily::cudatest
#endif
