// The host sampler's selection (maximum, exp pass, mass histogram, one ordered bin) against the plain
// definition: a full sort of the vocabulary, probabilities normalised over the top-k set, min-p, top-p
// and a walk in order. Kept ids and their order must be identical, probabilities equal to rounding, and
// seeded draws the same tokens, at vocabulary sizes 1, 2, 17, 151936 and 248320, with ties, -inf entries,
// every id but one masked, and with the kept set drawn from unordered (a small sort limit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "runtime/sampler.h"
#include "runtime/sampler_reference.h"

using namespace lily;

namespace {

enum class Shape { Peaked, Flat, Ties, Masked, OneLeft };

std::vector<float> make_logits(size_t V, Shape s, uint64_t seed) {
  std::mt19937 g{uint32_t(seed)};
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> l(V);
  for (auto& x : l) x = n01(g);
  switch (s) {
    case Shape::Peaked:  // LLM-like: a broad bulk and a few far above it
      for (auto& x : l) x *= 2.5f;
      for (size_t i = 0; i < std::min<size_t>(V, 8); ++i) l[(i * 7919) % V] = 12.0f + 2.0f * float(i % 3);
      break;
    case Shape::Flat:  // random weights: every id nearly equally likely
      for (auto& x : l) x *= 0.02f;
      break;
    case Shape::Ties:  // few distinct values, big tie groups
      for (auto& x : l) x = std::round(x * 2.0f) / 2.0f;
      break;
    case Shape::Masked:  // logit_bias / constraint style -inf entries
      for (size_t i = 0; i < V; ++i)
        if (i % 3 == 1) l[i] = -std::numeric_limits<float>::infinity();
      break;
    case Shape::OneLeft:
      for (auto& x : l) x = -std::numeric_limits<float>::infinity();
      l[(V * 3) / 5] = 0.25f;
      break;
  }
  return l;
}

const char* shape_name(Shape s) {
  switch (s) {
    case Shape::Peaked: return "peaked";
    case Shape::Flat: return "flat";
    case Shape::Ties: return "ties";
    case Shape::Masked: return "masked";
    case Shape::OneLeft: return "one-left";
  }
  return "?";
}

struct Case {
  float temperature;
  int top_k;
  float top_p, min_p;
};

// The fast sampler with the default sort limit and with `small_limit` (its kept sets then drawn from
// unordered) against the reference: distributions, then `draws` seeded draws.
void compare(const std::vector<float>& l, const SamplingParams& p, size_t small_limit, int draws,
             const std::string& what, std::span<const int32_t> history = {}) {
  SCOPED_TRACE(what);
  ReferenceSampler ref(p);
  const auto want = ref.distribution(l, history);
  std::vector<int32_t> want_draws;
  ReferenceSampler rs(p);
  for (int d = 0; d < draws; ++d) want_draws.push_back(rs.sample(l, history));
  // The full sort sums its V terms one after the other (error up to ~V·eps, reached with big tie groups);
  // the histogram sums them in another order.
  const double rel = std::max(1e-13, 4.0 * double(l.size()) * std::numeric_limits<double>::epsilon());
  for (size_t limit : {Sampler::kDefaultSortLimit, small_limit}) {
    SCOPED_TRACE("sort limit " + std::to_string(limit));
    Sampler fast(p, limit);
    const auto got = fast.distribution(l, history);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].first, want[i].first) << "position " << i;
      ASSERT_NEAR(got[i].second, want[i].second, rel * want[i].second + 1e-300) << "id " << want[i].first;
    }
    Sampler fs(p, limit);
    for (int d = 0; d < draws; ++d) ASSERT_EQ(fs.sample(l, history), want_draws[size_t(d)]) << "draw " << d;
  }
}

TEST(Sampler, ExpMatchesStdExp) {
  std::mt19937_64 g(5);
  std::uniform_real_distribution<double> wide(-708.0, 0.0), narrow(-1.0, 0.0);
  std::vector<double> xs = {0.0, -0.0, -1e-300, -1e-17, -0.34657359027997264, -0.34657359027997270, -1.0, -20.0,
                            -700.0, -707.999};
  for (int i = 0; i < 200000; ++i) xs.push_back(i % 2 ? wide(g) : narrow(g));
  double worst = 0;
  for (double x : xs) {
    const double want = std::exp(x), got = detail::exp_nonpos(x);
    worst = std::max(worst, std::fabs(got - want) / want);
  }
  EXPECT_LE(worst, 2.5e-16);  // ~1 ulp
  EXPECT_EQ(detail::exp_nonpos(-709.0), 0.0);
  EXPECT_EQ(detail::exp_nonpos(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_EQ(detail::exp_nonpos(0.0), 1.0);
}

TEST(Sampler, FastSelectionMatchesFullSort) {
  const std::vector<Case> cases = {
      {1.0f, 0, 1.0f, 0.0f},    {0.7f, 0, 0.95f, 0.0f},  {1.0f, 0, 0.5f, 0.05f}, {0.8f, 40, 0.9f, 0.0f},
      {1.0f, 0, 1.0f, 0.1f},    {1.3f, 0, 0.999f, 0.0f}, {0.6f, 1, 1.0f, 0.0f},  {1.0f, 0, 1e-6f, 0.0f},
      {2.0f, -2, 0.9f, 0.0f},  // top_k = V / 2 (the nth_element path)
  };
  for (size_t V : {size_t(1), size_t(2), size_t(17), size_t(151936), size_t(248320)}) {
    const bool big = V > 100000;
    for (Shape s : {Shape::Peaked, Shape::Flat, Shape::Ties, Shape::Masked, Shape::OneLeft}) {
      const auto l = make_logits(V, s, V + size_t(s));
      for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        if (big && (ci % 3) != size_t(s) % 3 && ci != 0) continue;  // a spread of cases at the big sizes (the full sort is slow)
        SamplingParams p;
        p.temperature = c.temperature;
        p.top_k = c.top_k >= 0 ? c.top_k : int(std::max<size_t>(1, V / 2));
        p.top_p = c.top_p;
        p.min_p = c.min_p;
        p.seed = 11 + ci;
        const std::string what = "V=" + std::to_string(V) + " " + shape_name(s) + " case " + std::to_string(ci);
        compare(l, p, 3, big ? 4 : 64, what);
      }
    }
  }
}

TEST(Sampler, TiesKeepLowerIdsFirst) {
  const std::vector<float> l(17, 0.5f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;  // 8/17 < 0.5 <= 9/17: ids 0..8
  p.seed = 1;
  Sampler s(p);
  const auto d = s.distribution(l);
  ASSERT_EQ(d.size(), 9u);
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d[i].first, int32_t(i));
    EXPECT_DOUBLE_EQ(d[i].second, 1.0 / 9);
  }
  compare(l, p, 0, 200, "17 ties");
}

TEST(Sampler, AllMaskedButOne) {
  for (size_t V : {size_t(1), size_t(2), size_t(17), size_t(248320)}) {
    auto l = make_logits(V, Shape::OneLeft, 3);
    const int32_t only = int32_t((V * 3) / 5);
    for (float top_p : {1.0f, 0.9f}) {
      SamplingParams p;
      p.temperature = 0.8f;
      p.top_p = top_p;
      p.seed = 2;
      Sampler s(p, 0);
      for (int i = 0; i < 20; ++i) ASSERT_EQ(s.sample(l), only);
      if (top_p < 1.0f) {
        EXPECT_EQ(s.distribution(l), (std::vector<std::pair<int32_t, double>>{{only, 1.0}}));
      }
      p.min_p = 0.01f;
      EXPECT_EQ(Sampler(p).distribution(l), (std::vector<std::pair<int32_t, double>>{{only, 1.0}}));
    }
  }
}

TEST(Sampler, PenaltiesMatchFullSort) {
  const auto l = make_logits(151936, Shape::Peaked, 9);
  std::vector<int32_t> hist;
  for (int i = 0; i < 300; ++i) hist.push_back(int32_t((i * 7919) % 151936));
  hist.push_back(-1);      // ids outside the vocabulary are ignored
  hist.push_back(151936);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.seed = 4;
  compare(l, p, 0, 8, "penalties", hist);
  p.temperature = 0.0f;
  compare(l, p, 0, 4, "penalties, greedy", hist);
}

TEST(Sampler, RefusesLogitsWithoutADrawableToken) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> masked(100, -inf);
  EXPECT_THROW(Sampler(p).sample(masked), InternalError);
  std::vector<float> nan(100, 0.0f);
  nan[40] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(Sampler(p).sample(nan), InternalError);
  std::vector<float> pinf(100, 0.0f);
  pinf[7] = inf;
  EXPECT_THROW(Sampler(p).sample(pinf), InternalError);
}

}  // namespace
