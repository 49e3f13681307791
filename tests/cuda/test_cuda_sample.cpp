// Device sampling (backend/cuda/sample.h) against the host Sampler (runtime/sampler.h): the kept set and
// its probabilities on crafted logits, one row and many rows with their own parameters in one call, logit
// bias / vocabulary limit / mask, the distribution of many draws, seeds, greedy, graph capture (the
// generation loop's device path: test_cuda_generate.cpp).
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaSample, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <string>

#include "backend/cuda/sample.h"
#include "cuda_test_util.h"
#include "runtime/sampler.h"

using namespace lily;
using namespace lily::cudatest;

namespace {

cuda::SampleParams to_device(const SamplingParams& p) {
  cuda::SampleParams d;
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.repetition_penalty = p.repetition_penalty;
  d.presence_penalty = p.presence_penalty;
  d.frequency_penalty = p.frequency_penalty;
  d.seed = p.seed.value_or(0);
  return d;
}

// A batched sampler's device buffers (default stream): `rows` rows of logits, one slot per row (row r
// draws with slot r unless the call says otherwise).
struct DevSampler {
  int V, rows;
  void* mem = nullptr;
  cuda::SampleDev d;
  Dev<float> logits;
  Dev<int32_t> out;
  Dev<double> probs;
  Dev<int32_t> counts;  // [rows][V]
  Dev<cuda::SampleSlot> slots;
  Dev<int32_t> ident;
  std::vector<cuda::SampleSlot> host;
  DevSampler(int v, int max_draws = 1, int r = 1)
      : V(v), rows(r), logits(size_t(v) * size_t(r)), out(size_t(std::max(max_draws, r))), probs(size_t(v)),
        counts(size_t(v) * size_t(r)), slots(size_t(r)), ident(size_t(r)), host(size_t(r)) {
    LILY_CU(cudaMalloc(&mem, cuda::sample_bytes(V, rows)));
    d = cuda::sample_layout(mem, V, rows);
    std::vector<int32_t> id(static_cast<size_t>(rows));
    for (int i = 0; i < rows; ++i) id[size_t(i)] = i;
    ident.up(id);
    for (int i = 0; i < rows; ++i) host[size_t(i)].counts = counts.p + size_t(i) * size_t(V);
  }
  ~DevSampler() { cudaFree(mem); }
  void put_slots() { slots.up(host); }
  void setup_raw(const cuda::SampleParams& p, const std::vector<int32_t>& history = {}, uint64_t step = 0, int row = 0) {
    std::vector<int32_t> c(size_t(V), 0);
    for (int32_t t : history)
      if (t >= 0 && t < V) ++c[size_t(t)];
    LILY_CU(cudaMemcpy(counts.p + size_t(row) * size_t(V), c.data(), 4 * size_t(V), cudaMemcpyHostToDevice));
    host[size_t(row)].p = p;
    host[size_t(row)].step = step;
    put_slots();
  }
  void setup(const SamplingParams& p, const std::vector<int32_t>& history = {}, uint64_t step = 0, int row = 0) {
    setup_raw(to_device(p), history, step, row);
  }
  void set_logits(const std::vector<float>& l, int row = 0) {
    LILY_CU(cudaMemcpy(logits.p + size_t(row) * size_t(V), l.data(), 4 * size_t(V), cudaMemcpyHostToDevice));
  }
  // k-th draw (row 0, slot 0) into out[k] (no sync)
  void draw_async(int k = 0, cudaStream_t s = nullptr) {
    cuda::sample_rows(d, slots.p, logits.p, 1, nullptr, ident.p, nullptr, out.p + k, s);
  }
  int32_t draw() {
    draw_async(0);
    return out.down()[0];
  }
  std::vector<double> distribution(int row = 0, const cuda::SampleSlot* with = nullptr) {
    cuda::sample_probs(d, with ? with : slots.p, row, probs.p, nullptr);
    return probs.down();
  }
  std::vector<cuda::SampleSlot> slots_back() const {
    std::vector<cuda::SampleSlot> h(static_cast<size_t>(rows));
    LILY_CU(cudaDeviceSynchronize());
    LILY_CU(cudaMemcpy(h.data(), slots.p, sizeof(cuda::SampleSlot) * h.size(), cudaMemcpyDeviceToHost));
    return h;
  }
  uint64_t step(int row = 0) const { return slots_back()[size_t(row)].step; }
  std::vector<int32_t> counts_of(int row = 0) const {
    std::vector<int32_t> c(static_cast<size_t>(V));
    LILY_CU(cudaDeviceSynchronize());
    LILY_CU(cudaMemcpy(c.data(), counts.p + size_t(row) * size_t(V), 4 * size_t(V), cudaMemcpyDeviceToHost));
    return c;
  }
};

std::vector<float> random_logits(int V, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  return randn(size_t(V), rng, scale);
}

// Host kept set as id -> probability (renormalised over the kept set).
std::map<int32_t, double> host_dist(const SamplingParams& p, const std::vector<float>& logits, const std::vector<int32_t>& hist) {
  SamplingParams q = p;
  q.seed = 1;
  std::map<int32_t, double> m;
  for (auto [id, pr] : Sampler(q).distribution(logits, hist)) m[id] = pr;
  return m;
}

// True when moving top_p or min_p by one float step flips the host's cut: the host's cumulative sum sits
// within ~6e-8 of the threshold, closer than the device's fixed-point sums are promised to agree
// (~1e-12), so such a case says nothing about exactness.
bool borderline(const SamplingParams& p, const std::vector<float>& logits, const std::vector<int32_t>& hist) {
  const size_t n = host_dist(p, logits, hist).size();
  for (float dir : {0.0f, 2.0f}) {
    SamplingParams q = p;
    if (q.top_p < 1.0f) q.top_p = std::min(1.0f, std::nextafter(q.top_p, dir));
    if (q.min_p > 0.0f) q.min_p = std::min(1.0f, std::nextafter(q.min_p, dir));
    if (host_dist(q, logits, hist).size() != n) return true;
  }
  return false;
}

struct SampleCase {
  std::string name;
  SamplingParams p;
  std::vector<float> logits;
  std::vector<int32_t> history;
};

std::vector<SampleCase> cases(int V) {
  std::vector<SampleCase> cs;
  auto P = [](float T, int k, float tp, float mp) {
    SamplingParams p;
    p.temperature = T;
    p.top_k = k;
    p.top_p = tp;
    p.min_p = mp;
    p.seed = 99;
    return p;
  };
  const auto base = random_logits(V, 1000u + uint32_t(V), 3.0f);
  cs.push_back({"chat defaults (T 0.7, top-k 20, top-p 0.8)", P(0.7f, 20, 0.8f, 0), base, {}});
  cs.push_back({"plain temperature 1", P(1.0f, 0, 1.0f, 0), base, {}});
  cs.push_back({"plain temperature 0.05", P(0.05f, 0, 1.0f, 0), base, {}});
  cs.push_back({"top-k 1", P(1.0f, 1, 1.0f, 0), base, {}});
  cs.push_back({"top-k V", P(1.0f, V, 1.0f, 0), base, {}});
  cs.push_back({"top-k V+5", P(1.0f, V + 5, 0.9f, 0), base, {}});
  cs.push_back({"top-p tiny", P(1.0f, 0, 1e-6f, 0), base, {}});
  cs.push_back({"top-p 0.95 alone", P(1.3f, 0, 0.95f, 0), base, {}});
  cs.push_back({"min-p 0.05", P(1.3f, 0, 1.0f, 0.05f), base, {}});
  cs.push_back({"min-p 1", P(1.0f, 0, 1.0f, 1.0f), base, {}});
  cs.push_back({"min-p + top-p + top-k", P(0.9f, 100, 0.9f, 0.02f), base, {}});
  // ties: few distinct values, so top-k and top-p cut inside groups of equal logits (lowest ids first)
  std::vector<float> tied(base);
  for (auto& x : tied) x = std::round(x);
  cs.push_back({"ties, top-k 50", P(1.0f, 50, 1.0f, 0), tied, {}});
  cs.push_back({"ties, top-p 0.45", P(1.0f, 0, 0.45f, 0), tied, {}});
  cs.push_back({"ties, top-k 37, top-p 0.63", P(0.8f, 37, 0.63f, 0), tied, {}});
  std::vector<float> flat(size_t(V), 1.5f);
  cs.push_back({"all equal, top-k V/3, top-p 0.45", P(1.0f, V / 3, 0.45f, 0), flat, {}});
  cs.push_back({"all equal, plain", P(1.0f, 0, 1.0f, 0), flat, {}});
  std::vector<float> zeros(size_t(V), 0.0f);
  for (int i = 0; i < V; i += 3) zeros[size_t(i)] = -0.0f;  // -0 and +0 are one tie group
  cs.push_back({"signed zeros, top-k 7", P(1.0f, 7, 1.0f, 0), zeros, {}});
  cs.push_back({"signed zeros, greedy", P(0.0f, 0, 1.0f, 0), zeros, {}});
  // penalties with repeated history ids, including the most likely ones (exact in float: 1.25, .5, .25)
  std::vector<int32_t> hist;
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return base[size_t(a)] > base[size_t(b)]; });
  for (int j = 0; j < std::min(V, 12); ++j)
    for (int r = 0; r <= j % 4; ++r) hist.push_back(order[size_t(j)]);
  hist.push_back(-1);  // out of range: ignored, as on the host
  hist.push_back(V + 7);
  SamplingParams pen = P(0.9f, 40, 1.0f, 0);
  pen.repetition_penalty = 1.25f;
  pen.presence_penalty = 0.5f;
  pen.frequency_penalty = 0.25f;
  cs.push_back({"penalties, top-k 40", pen, base, hist});
  pen.temperature = 0.0f;
  cs.push_back({"penalties, greedy", pen, base, hist});
  SamplingParams neg = P(1.0f, 0, 0.9f, 0);
  neg.repetition_penalty = 0.8f;
  neg.presence_penalty = -0.5f;
  neg.frequency_penalty = -0.25f;
  cs.push_back({"negative penalties, top-p 0.9", neg, base, hist});
  return cs;
}

class CudaSampleV : public ::testing::TestWithParam<int> {};

TEST_P(CudaSampleV, KeptSetAndProbabilitiesMatchHost) {
  LILY_REQUIRE_GPU();
  const int V = GetParam();
  DevSampler ds(V);
  int checked = 0;
  for (const SampleCase& c : cases(V)) {
    SCOPED_TRACE(c.name + ", V " + std::to_string(V));
    if (borderline(c.p, c.logits, c.history)) {
      std::printf("[V %d] %s: host cut within 1e-9 of flipping, skipped\n", V, c.name.c_str());
      continue;
    }
    const auto host = host_dist(c.p, c.logits, c.history);
    ds.set_logits(c.logits);
    ds.setup(c.p, c.history);
    const int32_t tok = ds.draw();
    const auto dev = ds.distribution();
    EXPECT_TRUE(host.count(tok)) << "drawn id " << tok << " is outside the host's kept set";
    size_t kept = 0;
    double worst = 0;
    for (int i = 0; i < V; ++i) {
      const bool in_dev = dev[size_t(i)] >= 0.0, in_host = host.count(i) > 0;
      ASSERT_EQ(in_dev, in_host) << "id " << i << " (logit " << c.logits[size_t(i)] << ")";
      if (!in_host) continue;
      ++kept;
      const double hp = host.at(i);
      worst = std::max(worst, std::abs(dev[size_t(i)] - hp));
      // fixed point: |Δ| <= a few 2^-44 per unit of mass, relative to the kept total
      ASSERT_NEAR(dev[size_t(i)], hp, 1e-9 + 1e-7 * hp) << "id " << i;
    }
    EXPECT_EQ(kept, host.size());
    ++checked;
  }
  EXPECT_GT(checked, 15);
}

TEST_P(CudaSampleV, GreedyIsHostArgmax) {
  LILY_REQUIRE_GPU();
  const int V = GetParam();
  DevSampler ds(V);
  Dev<int32_t> am(1);
  Dev<char> amax_scratch(cuda::argmax_scratch_bytes(1));
  LILY_CU(cudaMemset(amax_scratch.p, 0, amax_scratch.n));
  for (uint32_t seed = 0; seed < 3; ++seed) {
    auto l = random_logits(V, seed, 2.0f);
    for (auto& x : l) x = std::round(x * 4) / 4;  // ties
    SamplingParams p;  // temperature 0
    const int32_t host = Sampler(p).sample(l);
    ds.set_logits(l);
    ds.setup(p);
    EXPECT_EQ(ds.draw(), host);
    cuda::argmax(ds.logits.p, 1, V, am.p, amax_scratch.p, nullptr);
    EXPECT_EQ(am.down()[0], host) << "the argmax kernel the greedy graph uses";
  }
}

// Compares the distribution row `row` of the last call drew from with the host's, and the drawn id.
void expect_row_matches(DevSampler& ds, int row, int32_t tok, const SamplingParams& p, const std::vector<float>& logits,
                        const std::vector<int32_t>& history, const cuda::SampleSlot* slots = nullptr) {
  const auto host = host_dist(p, logits, history);
  const auto dev = ds.distribution(row, slots);
  EXPECT_TRUE(host.count(tok)) << "row " << row << ": drawn id " << tok << " is outside the host's kept set";
  size_t kept = 0;
  for (int i = 0; i < ds.V; ++i) {
    const bool in_dev = dev[size_t(i)] >= 0.0, in_host = host.count(i) > 0;
    ASSERT_EQ(in_dev, in_host) << "row " << row << " id " << i << " (logit " << logits[size_t(i)] << ")";
    if (!in_host) continue;
    ++kept;
    ASSERT_NEAR(dev[size_t(i)], host.at(i), 1e-9 + 1e-7 * host.at(i)) << "row " << row << " id " << i;
  }
  EXPECT_EQ(kept, host.size()) << "row " << row;
}

// One call over many rows, each with its own parameters, logits row (read in reverse order: src) and
// history: per row the host's kept set and probabilities; each slot's counter and counts advance by its draw.
TEST_P(CudaSampleV, BatchedRowsMatchHostPerRow) {
  LILY_REQUIRE_GPU();
  const int V = GetParam();
  const auto cs = cases(V);
  std::vector<const SampleCase*> pick;
  for (size_t i = 0; i < cs.size(); i += 2)
    if (!borderline(cs[i].p, cs[i].logits, cs[i].history)) pick.push_back(&cs[i]);
  const int R = int(pick.size());
  ASSERT_GE(R, 5);
  DevSampler ds(V, R, R);
  std::vector<int32_t> src(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    src[size_t(r)] = R - 1 - r;
    ds.set_logits(pick[size_t(r)]->logits, R - 1 - r);
    ds.setup(pick[size_t(r)]->p, pick[size_t(r)]->history, uint64_t(r) * 7, r);
  }
  Dev<int32_t> dsrc(src);
  cuda::sample_rows(ds.d, ds.slots.p, ds.logits.p, R, dsrc.p, ds.ident.p, nullptr, ds.out.p, nullptr);
  const auto ids = ds.out.down();
  for (int r = 0; r < R; ++r) {
    SCOPED_TRACE(pick[size_t(r)]->name + ", V " + std::to_string(V) + ", row " + std::to_string(r));
    expect_row_matches(ds, r, ids[size_t(r)], pick[size_t(r)]->p, pick[size_t(r)]->logits, pick[size_t(r)]->history);
    EXPECT_EQ(ds.step(r), uint64_t(r) * 7 + 1);
    std::vector<int32_t> want(size_t(V), 0);
    for (int32_t t : pick[size_t(r)]->history)
      if (t >= 0 && t < V) ++want[size_t(t)];
    ++want[size_t(ids[size_t(r)])];
    EXPECT_EQ(ds.counts_of(r), want);
  }
}

INSTANTIATE_TEST_SUITE_P(CudaSampleVocab, CudaSampleV, ::testing::Values(1, 2, 17, 151936, 248320));

// Many draws (the step counter advances) against the host probabilities: chi-square at p ~ 1e-4, fixed seed.
TEST(CudaSample, DrawsFollowTheDistribution) {
  LILY_REQUIRE_GPU();
  struct D { int V; SamplingParams p; };
  auto P = [](float T, int k, float tp, float mp) {
    SamplingParams p;
    p.temperature = T; p.top_k = k; p.top_p = tp; p.min_p = mp; p.seed = 2024;
    return p;
  };
  for (const D& c : {D{17, P(1.0f, 0, 1.0f, 0)}, D{1000, P(0.8f, 50, 0.9f, 0)}, D{151936, P(1.0f, 0, 0.95f, 0.01f)},
                     D{248320, P(1.2f, 0, 1.0f, 0)}}) {
    SCOPED_TRACE("V " + std::to_string(c.V));
    const int N = 20000;
    auto l = random_logits(c.V, 7u, c.V > 1000 ? 3.0f : 1.0f);
    const auto host = host_dist(c.p, l, {});
    DevSampler ds(c.V, N);
    ds.set_logits(l);
    ds.setup(c.p);
    for (int k = 0; k < N; ++k) ds.draw_async(k);
    const auto ids = ds.out.down();
    EXPECT_EQ(ds.step(), uint64_t(N));
    std::map<int32_t, int> seen;
    for (int32_t t : ids) {
      ASSERT_TRUE(host.count(t)) << "id " << t << " outside the kept set";
      ++seen[t];
    }
    // bins with expected count >= 5, the rest pooled
    double chi2 = 0, pool_e = 0, pool_o = 0;
    int df = -1;
    for (auto [id, pr] : host) {
      const double e = pr * N, o = seen.count(id) ? seen[id] : 0;
      if (e >= 5) { chi2 += (o - e) * (o - e) / e; ++df; }
      else { pool_e += e; pool_o += o; }
    }
    if (pool_e > 0) { chi2 += (pool_o - pool_e) * (pool_o - pool_e) / std::max(pool_e, 1e-9); ++df; }
    ASSERT_GE(df, 1);
    const double z = 3.72, a = 2.0 / (9.0 * df);
    const double crit = df * std::pow(1 - a + z * std::sqrt(a), 3);  // Wilson-Hilferty, upper 1e-4
    std::printf("[V %d] chi2 %.1f, df %d, critical %.1f\n", c.V, chi2, df, crit);
    EXPECT_LT(chi2, crit);
  }
}

TEST(CudaSample, SeedReproducesAndHistoryUpdates) {
  LILY_REQUIRE_GPU();
  const int V = 151936, N = 200;
  auto l = random_logits(V, 5u, 2.0f);
  SamplingParams p;
  p.temperature = 1.0f; p.top_k = 40; p.top_p = 0.95f;
  p.repetition_penalty = 1.3f; p.frequency_penalty = 0.5f;  // later draws depend on earlier ones
  std::vector<int32_t> hist = {3, 3, 9};
  auto run = [&](uint64_t seed) {
    DevSampler ds(V, N);
    ds.set_logits(l);
    p.seed = seed;
    ds.setup(p, hist);
    for (int k = 0; k < N; ++k) ds.draw_async(k);
    auto ids = ds.out.down();
    EXPECT_EQ(ds.step(), uint64_t(N));
    std::vector<int32_t> want(size_t(V), 0);
    for (int32_t t : hist) ++want[size_t(t)];
    for (int32_t t : ids) ++want[size_t(t)];
    EXPECT_EQ(ds.counts_of(), want) << "counts = history + every draw";
    return ids;
  };
  const auto a = run(11), b = run(11), c = run(12);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // the generator: 53-bit uniform in [0, 1), different per step and per seed
  EXPECT_NE(cuda::sample_uniform(1, 0), cuda::sample_uniform(1, 1));
  EXPECT_NE(cuda::sample_uniform(1, 0), cuda::sample_uniform(2, 0));
  for (uint64_t s = 0; s < 1000; ++s) {
    const double u = cuda::sample_uniform(77, s);
    ASSERT_TRUE(u >= 0.0 && u < 1.0);
  }
}

// Logit bias, vocabulary limit and the allowed-id mask in the host's order (bias, then the limit and the
// mask as -inf, then the sampler); the mask applies to the slot's first row of a call only and is cleared by
// it; two rows of one slot draw at counters step and step + 1.
TEST(CudaSample, BiasLimitAndMaskAsTheHost) {
  LILY_REQUIRE_GPU();
  const int V = 4096, lim = 3500;
  auto l = random_logits(V, 13u, 1.5f);
  std::vector<float> bias(static_cast<size_t>(V), 0.0f);
  for (int t = 5; t < V; t += 397) bias[size_t(t)] = 4.0f;
  std::vector<uint64_t> mask(size_t((V + 63) / 64), 0);
  for (int t = 0; t < V; ++t)
    if (t % 3 != 1) mask[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
  DevSampler ds(V, 3, 2);
  Dev<float> dbias(bias);
  Dev<uint64_t> dmask(mask);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 3;
  cuda::SampleParams dp = to_device(p);
  dp.vocab_limit = lim;
  ds.setup_raw(dp, {}, 10, 0);
  SamplingParams q;
  q.temperature = 0.7f;
  q.top_k = 30;
  q.seed = 4;
  ds.setup(q, {}, 0, 1);
  ds.host[0].bias = dbias.p;
  ds.host[0].mask = dmask.p;
  ds.host[0].mask_on = 1;
  ds.put_slots();
  ds.set_logits(l, 0);
  ds.set_logits(l, 1);
  // rows: (logits 0, slot 0, rank 0), (logits 0, slot 0, rank 1), (logits 1, slot 1, rank 0)
  Dev<int32_t> src(std::vector<int32_t>{0, 0, 1}), slot(std::vector<int32_t>{0, 0, 1}), off(std::vector<int32_t>{0, 1, 0});
  DevSampler big(V, 3, 3);  // scratch for three rows; the slots and logits of `ds`
  cuda::sample_rows(big.d, ds.slots.p, ds.logits.p, 3, src.p, slot.p, off.p, ds.out.p, nullptr);
  const auto ids = ds.out.down();
  std::vector<float> biased = l;
  for (int t = 0; t < V; ++t) biased[size_t(t)] += bias[size_t(t)];
  for (int t = lim; t < V; ++t) biased[size_t(t)] = -INFINITY;
  std::vector<float> masked = biased;
  for (int t = 0; t < V; ++t)
    if (!(mask[size_t(t) >> 6] >> (t & 63) & 1)) masked[size_t(t)] = -INFINITY;
  expect_row_matches(big, 0, ids[0], p, masked, {}, ds.slots.p);
  expect_row_matches(big, 1, ids[1], p, biased, {}, ds.slots.p);
  expect_row_matches(big, 2, ids[2], q, l, {}, ds.slots.p);
  EXPECT_LT(ids[0], lim);
  EXPECT_NE(ids[0] % 3, 1) << "masked id drawn";
  const auto back = ds.slots_back();
  EXPECT_EQ(back[0].mask_on, 0) << "the draw clears the mask";
  EXPECT_EQ(back[0].step, 12u);
  EXPECT_EQ(back[1].step, 1u);
  EXPECT_NE(cuda::sample_uniform(3, 10), cuda::sample_uniform(3, 11));
}

// vocab_limit: ids at or past it are never drawn, whatever their logits (the top of the distribution is
// placed there), greedy and sampled; the distribution equals the host's over the masked row.
TEST(CudaSample, VocabLimitMasksTheTail) {
  LILY_REQUIRE_GPU();
  const int V = 4096, lim = 3000, N = 300;
  auto l = random_logits(V, 9u, 1.0f);
  for (int t = lim; t < V; t += 7) l[size_t(t)] += 8.0f;  // the most likely ids sit past the limit
  auto masked = l;
  for (int t = lim; t < V; ++t) masked[size_t(t)] = -INFINITY;
  for (float T : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = T;
    p.top_p = T > 0 ? 0.9f : 1.0f;
    p.seed = 5;
    DevSampler ds(V, N);
    ds.set_logits(l);
    cuda::SampleParams dp = to_device(p);
    dp.vocab_limit = lim;
    ds.setup_raw(dp);
    for (int k = 0; k < N; ++k) ds.draw_async(k);
    for (int32_t t : ds.out.down()) ASSERT_LT(t, lim) << "T " << T;
    if (T == 0.0f) {
      EXPECT_EQ(ds.out.down()[0], Sampler(p).sample(masked));
    }
    auto dist = ds.distribution();
    for (auto [id, prob] : Sampler(p).distribution(masked)) EXPECT_NEAR(dist[size_t(id)], prob, 1e-9) << id;
  }
}

// The draw captured in a graph and replayed gives the same ids as eager launches (no host sync inside,
// parameters, history and step read from the device at run time).
TEST(CudaSample, CapturedGraphMatchesEager) {
  LILY_REQUIRE_GPU();
  const int V = 248320, N = 64;
  auto l = random_logits(V, 9u, 3.0f);
  SamplingParams p;
  p.temperature = 0.8f; p.top_k = 20; p.top_p = 0.8f; p.presence_penalty = 1.0f; p.seed = 5;
  DevSampler eager(V, N);
  eager.set_logits(l);
  eager.setup(p);
  for (int k = 0; k < N; ++k) eager.draw_async(k);
  const auto want = eager.out.down();

  DevSampler g(V, N);
  g.set_logits(l);
  g.setup(p);
  cudaStream_t s;
  LILY_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Dev<int32_t> slot(1);
  cudaGraph_t graph;
  LILY_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cuda::sample_rows(g.d, g.slots.p, g.logits.p, 1, nullptr, g.ident.p, nullptr, slot.p, s);
  LILY_CU(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t ex;
  LILY_CU(cudaGraphInstantiate(&ex, graph, 0));
  std::vector<int32_t> got;
  for (int k = 0; k < N; ++k) {
    LILY_CU(cudaGraphLaunch(ex, s));
    int32_t t;
    LILY_CU(cudaMemcpyAsync(&t, slot.p, 4, cudaMemcpyDeviceToHost, s));
    LILY_CU(cudaStreamSynchronize(s));
    got.push_back(t);
  }
  EXPECT_EQ(got, want);
  // new parameters without re-capture: greedy
  SamplingParams gp;
  g.setup(gp);
  LILY_CU(cudaGraphLaunch(ex, s));
  LILY_CU(cudaStreamSynchronize(s));
  EXPECT_EQ(slot.down()[0], Sampler(gp).sample(l));
  cudaGraphExecDestroy(ex);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

// Time per draw (graph replays, CUDA events) for V = 248,320 at a few settings; printed for the record,
// bounded loosely so a pathological slowdown fails.
TEST(CudaSample, TimePerDraw) {
  LILY_REQUIRE_GPU();
  const int V = 248320, N = 200;
  auto l = random_logits(V, 21u, 3.0f);
  struct C { const char* name; SamplingParams p; };
  auto P = [](float T, int k, float tp, float mp, float rep) {
    SamplingParams p;
    p.temperature = T; p.top_k = k; p.top_p = tp; p.min_p = mp; p.repetition_penalty = rep; p.seed = 1;
    return p;
  };
  cudaStream_t s;
  LILY_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  LILY_CU(cudaEventCreate(&e0));
  LILY_CU(cudaEventCreate(&e1));
  for (const C& c : {C{"greedy + repetition penalty", P(0, 0, 1, 0, 1.1f)}, C{"T 0.7, top-k 20, top-p 0.8", P(0.7f, 20, 0.8f, 0, 1)},
                     C{"T 1, no filter", P(1, 0, 1, 0, 1)}, C{"T 1, top-p 0.95", P(1, 0, 0.95f, 0, 1)},
                     C{"T 1, min-p 0.05", P(1, 0, 1, 0.05f, 1)}}) {
    DevSampler ds(V);
    ds.set_logits(l);
    ds.setup(c.p, {1, 2, 3});
    cudaGraph_t graph;
    LILY_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ds.draw_async(0, s);
    LILY_CU(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t ex;
    LILY_CU(cudaGraphInstantiate(&ex, graph, 0));
    for (int i = 0; i < 10; ++i) LILY_CU(cudaGraphLaunch(ex, s));
    LILY_CU(cudaEventRecord(e0, s));
    for (int i = 0; i < N; ++i) LILY_CU(cudaGraphLaunch(ex, s));
    LILY_CU(cudaEventRecord(e1, s));
    LILY_CU(cudaEventSynchronize(e1));
    float ms = 0;
    LILY_CU(cudaEventElapsedTime(&ms, e0, e1));
    const double us = 1000.0 * ms / N;
    std::printf("[V %d] %-30s %.1f us per draw\n", V, c.name, us);
    EXPECT_LT(us, 1000.0) << c.name;
    cudaGraphExecDestroy(ex);
    cudaGraphDestroy(graph);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
}

}  // namespace
#endif
