// Speculative sampling keeps the distribution (runtime/verify.h): fixed seeds, enough draws, a chi-square
// test at p = 1e-4 (Wilson-Hilferty quantile) against the exact distribution. Unit level: drafts from a q
// unlike p, one-hot drafts, drafts outside p's support (top-k); end to end through the generation loop:
// the joint distribution of the first three sampled tokens of a golden model with drafts from a q (host
// path) and with device-drawn verification. Plus typical acceptance's
// rule and the depth planner.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "../support/sampling_backend.h"
#include "core/mapped_file.h"
#include "runtime/drafter.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "runtime/verify.h"

using namespace lily;

namespace {

// chi-square quantile at 1 - 1e-4 for `dof` degrees of freedom (Wilson-Hilferty)
double chi2_limit(int dof) {
  const double z = 3.719, a = 2.0 / (9.0 * dof);
  return dof * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Pearson's statistic of `counts` (n draws) against `p`, cells with expected count < 5 merged into one.
// Returns (statistic, degrees of freedom).
std::pair<double, int> chi2(const std::map<int64_t, int64_t>& counts, const std::map<int64_t, double>& p, int64_t n) {
  double stat = 0, rest_e = 0, rest_o = 0;
  int cells = 0;
  for (const auto& [k, pk] : p) {
    const double e = pk * double(n);
    const double o = counts.count(k) ? double(counts.at(k)) : 0.0;
    if (e < 5) {
      rest_e += e;
      rest_o += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++cells;
  }
  for (const auto& [k, c] : counts)
    if (!p.count(k)) rest_o += double(c);  // a draw outside the support
  if (rest_e > 0 || rest_o > 0) {
    stat += rest_e > 0 ? (rest_o - rest_e) * (rest_o - rest_e) / rest_e : 1e9;
    ++cells;
  }
  return {stat, cells - 1};
}

std::map<int64_t, double> as_map(const std::vector<std::pair<int32_t, double>>& d) {
  std::map<int64_t, double> m;
  for (auto [t, pr] : d) m[t] += pr;
  return m;
}

TEST(Verify, SpeculativeSamplingKeepsTheDistribution) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.5f, 0.7f, 1.1f};
  struct Case {
    std::string name;
    SamplingParams sp;
    std::vector<std::pair<int32_t, double>> q;  // empty: one-hot at `d`
    int32_t d = 0;
  };
  SamplingParams t1;
  t1.temperature = 1.0f;
  SamplingParams topk = t1;
  topk.top_k = 3;
  topk.temperature = 0.7f;
  const std::vector<std::pair<int32_t, double>> q = {{0, 0.05}, {1, 0.3}, {2, 0.2}, {3, 0.05}, {4, 0.1}, {5, 0.1}, {6, 0.1}, {7, 0.1}};
  const std::vector<Case> cases = {{"q unlike p", t1, q},         {"one-hot, likely", t1, {}, 3}, {"one-hot, unlikely", t1, {}, 5},
                                   {"top-k, q wider than p", topk, q}, {"top-k, one-hot outside", topk, {}, 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SamplingParams sp = c.sp;
    sp.seed = 42;
    Sampler s(sp), ref(sp);
    const auto p = ref.distribution(logits);
    std::mt19937_64 g(7);
    std::discrete_distribution<int> qd;
    if (!c.q.empty()) {
      std::vector<double> w;
      for (auto [t, pr] : c.q) w.push_back(pr);
      qd = std::discrete_distribution<int>(w.begin(), w.end());
    }
    const int64_t n = 200000;
    std::map<int64_t, int64_t> counts;
    int64_t accepted = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t d = c.q.empty() ? c.d : c.q[size_t(qd(g))].first;
      const Verdict v = verify_draft(s, logits, {}, d, c.q);
      ++counts[v.token];
      accepted += v.accepted;
      if (v.accepted) {
        EXPECT_EQ(v.token, d);
      }
    }
    const auto [stat, dof] = chi2(counts, as_map(p), n);
    EXPECT_LT(stat, chi2_limit(dof)) << "chi2 " << stat << " dof " << dof;
    // acceptance: sum_x min(p(x), q(x))
    double want = 0;
    const auto pm = as_map(p);
    if (c.q.empty()) {
      want = pm.count(c.d) ? pm.at(c.d) : 0.0;
    } else {
      for (auto [t, qt] : c.q) want += std::min(qt, pm.count(t) ? pm.at(t) : 0.0);
    }
    EXPECT_NEAR(double(accepted) / double(n), want, 0.005);
  }
}

TEST(Verify, GreedyAndTypicalAcceptance) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.5f, 2.9f};
  Sampler g(SamplingParams{});
  EXPECT_EQ(verify_draft(g, logits, {}, 1, {}).token, 1);
  EXPECT_TRUE(verify_draft(g, logits, {}, 1, {}).accepted);
  const Verdict v = verify_draft(g, logits, {}, 3, {});
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 1);
  // typical: accepted iff p(d) >= min(t, sqrt(t) exp(-H)), H of p
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 3;
  Sampler s(sp);
  const auto p = s.distribution(logits);
  double H = 0;
  for (auto [t, pr] : p) H -= pr * std::log(pr);
  for (float thr : {0.05f, 0.2f, 0.4f}) {
    const double cut = std::min(double(thr), std::sqrt(double(thr)) * std::exp(-H));
    for (auto [t, pr] : p) EXPECT_EQ(verify_draft(s, logits, {}, t, {}, thr).accepted, pr >= cut) << "thr " << thr << " id " << t;
  }
}

// Drafts the token after t1 from q = uniform over the target's top-4 ids after t1 and one id outside
// them (known from a table), so that drafts are accepted, rejected, and sometimes outside p's support.
class TableDrafter final : public Drafter {
 public:
  TableDrafter(std::map<int32_t, std::vector<int32_t>> cand, uint64_t seed) : cand_(std::move(cand)), rng_(seed) {}
  std::string name() const override { return "table"; }
  void begin(const DraftRequest& r) override {
    const auto& c = cand_.at(r.tokens.back());
    d_ = {};
    std::vector<std::pair<int32_t, double>> q;
    for (int32_t t : c) q.push_back({t, 1.0 / double(c.size())});
    d_.tokens = {c[std::uniform_int_distribution<size_t>(0, c.size() - 1)(rng_)]};
    d_.q = {q};
  }
  Draft draft(SequenceState&) override { return std::move(d_); }

 private:
  std::map<int32_t, std::vector<int32_t>> cand_;
  std::mt19937_64 rng_;
  Draft d_;
};

// The first three sampled tokens through the loop with speculation (t2, t3 from a round of one draft):
// their joint distribution is the plain one, p(t1) p(t2 | t1) p(t3 | t1 t2), with top-k 4, temperature 1.
// Host path: min(1, p/q) and the residual; device path: the device's draws matched against the draft.
TEST(Verify, LoopKeepsTheJointDistribution) {
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  auto w = ModelWeights::load(dir);
  auto ids = nlohmann::json::parse(read_text_file(dir + "/golden.json"))["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 6);
  EngineOptions eo;
  eo.ctx_size = 16;
  auto host = Engine::from_weights(w, eo);
  auto dev = Engine::from_backend(w, std::make_unique<test_support::SamplingCpuBackend>(w), eo);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 4;
  // the exact joint distribution, and the drafter's candidates after each t1
  std::map<int64_t, double> joint;
  std::map<int32_t, std::vector<int32_t>> cand;
  const int64_t V = w->cfg.vocab;
  {
    Sampler s(sp);
    Session a(*host);
    std::vector<float> l(static_cast<size_t>(V)), l2(l), l3(l);
    a.prefill(prompt, l.data());
    const Snapshot at = a.snapshot();
    for (auto [t1, p1] : s.distribution(l)) {
      a.restore(at);
      a.decode(t1, l2.data());
      const Snapshot at2 = a.snapshot();
      auto& c = cand[t1];
      for (auto [t2, p2] : s.distribution(l2)) {
        c.push_back(t2);
        a.restore(at2);
        a.decode(t2, l3.data());
        for (auto [t3, p3] : s.distribution(l3)) joint[(int64_t(t1) * V + t2) * V + t3] += p1 * p2 * p3;
      }
      c.push_back(int32_t((*std::max_element(c.begin(), c.end()) + 1) % V));  // outside the top 4
    }
  }
  for (Engine* e : {host.get(), dev.get()}) {
    SCOPED_TRACE(e->backend().name());
    const int64_t n = 1200;
    std::map<int64_t, int64_t> counts;
    int64_t drafted = 0, accepted = 0;  // over all draws
    for (int64_t i = 0; i < n; ++i) {
      GenParams p;
      p.max_tokens = 3;
      p.sampling = sp;
      p.sampling.seed = uint64_t(1000 + i);
      p.spec.drafter = std::make_shared<TableDrafter>(cand, uint64_t(77 + i));
      p.spec.depth = 1;
      Session s(*e);
      const auto r = generate(s, prompt, p);
      ASSERT_EQ(r.tokens.size(), 3u);
      drafted += r.spec.drafted;
      accepted += r.spec.accepted;
      ++counts[(int64_t(r.tokens[0]) * V + r.tokens[1]) * V + r.tokens[2]];
    }
    EXPECT_EQ(drafted, n) << "every request ran one round of one draft";
    EXPECT_GT(accepted, n / 10);
    EXPECT_LT(accepted, n - n / 10);
    const auto [stat, dof] = chi2(counts, joint, n);
    std::printf("%s: chi2 %.1f, %d dof (limit %.1f), %.1f%% of drafts accepted\n", e->backend().name().c_str(), stat, dof,
                chi2_limit(dof), 100.0 * double(accepted) / double(n));
    EXPECT_LT(stat, chi2_limit(dof));
  }
}

}  // namespace
