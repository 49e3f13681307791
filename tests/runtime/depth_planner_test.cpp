// Draft depth auto (runtime/depth_planner.h): the best expected depth from round costs, the cost
// interpolation, acceptance learnt per position, and the planner against every fixed depth on the
// round costs measured on the H200 (bench/RESULTS.md, speculative decoding, commit f8a34f5).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "runtime/depth_planner.h"

using namespace lily;

namespace {

TEST(DepthPlanner, PicksTheFastestExpectedDepth) {
  // verify cost 10 + 1.5 k ms, no draft cost
  std::vector<double> t;
  for (int k = 0; k <= 6; ++k) t.push_back(10 + 1.5 * k);
  auto best = [&](double a) { return DepthPlanner::best_depth(t, std::vector<double>{a}, 6); };
  // E(k)/T(k) by hand for a = 0.5: k=0 0.1, k=1 1.5/11.5=0.1304, k=2 1.75/13=0.1346, k=3 1.875/14.5=0.1293
  EXPECT_EQ(best(0.5), 2);
  EXPECT_EQ(best(0.0), 0);
  EXPECT_EQ(best(0.99), 6);
  EXPECT_NEAR(DepthPlanner::expected_tokens(std::vector<double>{0.86}, 3), 1 + 0.86 + 0.86 * 0.86 + 0.86 * 0.86 * 0.86, 1e-12);
  // costs: interpolation through measured points, and the prior slope with one point
  RoundCosts c;
  c.add_verify(2, 13.0);
  EXPECT_NEAR(c.verify_ms(0), 13.0 / 1.3, 1e-9);
  c.add_verify(4, 16.0);
  EXPECT_NEAR(c.verify_ms(3), 14.5, 1e-9);
  EXPECT_NEAR(c.verify_ms(6), 19.0, 1e-9);
  c.add_draft(2.0);
  EXPECT_NEAR(c.round_ms(6, true)[3], 14.5 + 6.0, 1e-9);
  // a request's planner: acceptance learnt per position, exploration around the best depth
  DepthPlanner pl(6, false);
  RoundCosts flat;
  for (int k = 0; k <= 6; ++k)
    for (int i = 0; i < 5; ++i) flat.add_verify(k, 10 + 0.5 * k);
  for (int r = 0; r < 200; ++r) pl.observe(6, 6, 6);  // everything accepted
  EXPECT_GT(pl.alpha(5), 0.95);
  EXPECT_EQ(pl.choose(flat), 6);
  DepthPlanner none(6, false);
  for (int r = 0; r < 200; ++r) none.observe(3, 0, 1);
  EXPECT_LT(none.alpha(0), 0.05);
  int zeros = 0;
  for (int r = 0; r < 32; ++r) zeros += none.choose(flat) == 0;
  EXPECT_GE(zeros, 28) << "speculation that never pays mostly stops";
}

// Requests of `tokens` tokens whose drafts are accepted independently with probability a, three in a row
// on one loop's costs (the first warms them; the other two count): the planner's tokens per ms against
// the best fixed depth's expected rate (0 = plain decoding included).
double planner_efficiency(const std::vector<double>& verify_ms, double draft_ms, double a, int tokens, int trials) {
  std::vector<double> round(verify_ms.size());
  for (size_t k = 0; k < round.size(); ++k) round[k] = verify_ms[k] + double(k) * draft_ms;
  double best = 0;
  for (size_t k = 0; k < round.size(); ++k) best = std::max(best, DepthPlanner::expected_tokens(std::vector<double>{a}, int(k)) / round[k]);
  const int kmax = int(round.size()) - 1;
  double sum = 0;
  for (int tr = 0; tr < trials; ++tr) {
    std::mt19937_64 rng(uint64_t(tr) * 7 + 1);
    std::uniform_real_distribution<double> U(0.0, 1.0);
    RoundCosts c;
    double got = 0, ms = 0;
    for (int req = 0; req < 3; ++req) {
      DepthPlanner p(kmax, true);
      for (int left = tokens; left > 0;) {
        const int k = std::min(p.choose(c), left - 1);
        c.add_verify(k, verify_ms[size_t(k)] * (1 + 0.02 * (U(rng) - 0.5)));  // +-1% timing noise
        for (int i = 0; i < k; ++i) c.add_draft(draft_ms);
        int acc = 0;
        while (acc < k && U(rng) < a) ++acc;
        if (k > 0) p.observe(k, acc, std::min(acc + 1, k));
        left -= acc + 1;
        if (req > 0) {
          got += acc + 1;
          ms += round[size_t(k)];
        }
      }
    }
    sum += got / ms / best;
  }
  return sum / trials;
}

TEST(DepthPlanner, WithinFivePercentOfTheBestFixedDepthOnMeasuredCosts) {
  struct Shape {
    const char* name;
    std::vector<double> verify_ms;  // k = 0..6: a plain step, then verifications of k drafts
    double draft_ms;
  };
  for (const Shape& s : {Shape{"35B-A3B", {2.383, 3.802, 5.426, 5.873, 7.535, 7.737, 8.180}, 0.303},
                         Shape{"80B-A3B", {2.941, 4.510, 6.129, 7.136, 9.147, 9.186, 9.840}, 0.242},
                         // H100, the multi-row paths of 2026-12-07 (bench/RESULTS.md, ninth session, call 6)
                         Shape{"35B-A3B H100", {2.486, 3.617, 4.698, 5.059, 6.180, 6.632, 6.744}, 0.302}})
    for (double a : {0.5, 0.7, 0.86, 0.95, 1.0}) {
      const double e = planner_efficiency(s.verify_ms, s.draft_ms, a, 256, 40);
      EXPECT_GE(e, 0.95) << s.name << " acceptance " << a;
      EXPECT_LE(e, 1.05) << s.name << " acceptance " << a;
    }
}

}  // namespace
