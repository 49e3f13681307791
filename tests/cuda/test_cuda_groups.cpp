// The batched short-group launches of a multi-sequence step (step_desc.h) against the one-sequence calls,
// at awkward shapes: gdn_groups (the fused step kernel over a grid of groups, and the three-kernel path of
// shapes it does not take) with tentative groups keeping a state version after every row in a wrapping
// ring; attn_prep + attn_decode_groups (one decode launch over the groups, each at its own position and
// cache) against attn_core per sequence at the same split.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaGroups, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "cuda_test_util.h"

namespace {
using namespace lily::cudatest;
using lily::cuda::DevGroup;
using lily::cuda::DevSlotLayer;
using lily::cuda::StepSeqs;

// Relative error of a against b (vectors of floats).
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_err(a, std::vector<double>(b.begin(), b.end()));
}

std::vector<float> slice(const std::vector<float>& v, size_t off, size_t n) {
  return std::vector<float>(v.begin() + std::ptrdiff_t(off), v.begin() + std::ptrdiff_t(off + n));
}

// The step form of a batch: groups side by side (slot g = group g), the list in reverse order.
struct Batch {
  std::vector<int> first;
  int T = 0;
  std::vector<int32_t> row_group, list, rows;
  explicit Batch(const std::vector<int>& sizes) {
    for (size_t g = 0; g < sizes.size(); ++g) {
      first.push_back(T);
      for (int r = 0; r < sizes[g]; ++r) row_group.push_back(int32_t(g));
      T += sizes[g];
    }
    for (int g = int(sizes.size()) - 1; g >= 0; --g) {
      list.push_back(g);
      for (int r = 0; r < sizes[size_t(g)]; ++r) rows.push_back(first[size_t(g)] + r);
    }
  }
};

void run_gdn_groups_case(int Hk, int Hv, int dk, int dv, int K, const std::vector<int>& sizes,
                         const std::vector<bool>& tentative, std::mt19937& rng) {
  SCOPED_TRACE("Hk " + std::to_string(Hk) + " Hv " + std::to_string(Hv) + " dk " + std::to_string(dk) + " dv " +
               std::to_string(dv) + " K " + std::to_string(K));
  lily::cuda::GdnDev g;
  g.Hk = Hk; g.Hv = Hv; g.dk = dk; g.dv = dv; g.K = K;
  const int C = g.C(), PW = g.proj_width();
  Dev<float> dconv(randn(size_t(C) * K, rng, 0.5f)), ddtb(randn(size_t(Hv), rng, 0.5f)), dnorm(randn(size_t(dv), rng, 0.3f));
  std::vector<float> Aneg(static_cast<size_t>(Hv));
  for (auto& a : Aneg) a = -std::exp(std::uniform_real_distribution<float>(-1.f, 1.f)(rng));
  Dev<float> dA(Aneg);
  g.conv = dconv.p; g.dt_bias = ddtb.p; g.A_neg = dA.p; g.norm = dnorm.p;
  const size_t cn = size_t(K - 1) * C, sn = size_t(Hv) * dv * dk;
  const Batch b(sizes);
  const int G = int(sizes.size()), T = b.T;
  Dev<float> dproj(randn(size_t(T) * PW, rng));
  // per group: a ring of R versions, the current one (cur = R - 1: the tentative versions wrap) random,
  // the others NaN
  std::vector<int> R(static_cast<size_t>(G)), cur(static_cast<size_t>(G));
  std::vector<std::vector<float>> c0(static_cast<size_t>(G)), s0(static_cast<size_t>(G));
  std::vector<std::unique_ptr<Dev<float>>> cring, sring;
  std::vector<DevSlotLayer> tab(static_cast<size_t>(G));
  std::vector<DevGroup> grp(static_cast<size_t>(G));
  for (int i = 0; i < G; ++i) {
    R[size_t(i)] = tentative[size_t(i)] ? sizes[size_t(i)] + 2 : 1;
    cur[size_t(i)] = R[size_t(i)] - 1;
    c0[size_t(i)] = randn(cn, rng, 0.7f);
    s0[size_t(i)] = randn(sn, rng, 0.05f);
    cring.push_back(std::make_unique<Dev<float>>(cn * size_t(R[size_t(i)])));
    sring.push_back(std::make_unique<Dev<float>>(sn * size_t(R[size_t(i)])));
    cring.back()->poison();
    sring.back()->poison();
    LILY_CU(cudaMemcpy(cring.back()->p + cn * size_t(cur[size_t(i)]), c0[size_t(i)].data(), 4 * cn, cudaMemcpyHostToDevice));
    LILY_CU(cudaMemcpy(sring.back()->p + sn * size_t(cur[size_t(i)]), s0[size_t(i)].data(), 4 * sn, cudaMemcpyHostToDevice));
    tab[size_t(i)].conv = cring.back()->p;
    tab[size_t(i)].S = sring.back()->p;
    DevGroup& d = grp[size_t(i)];
    d.first = b.first[size_t(i)]; d.rows = sizes[size_t(i)]; d.slot = i; d.tentative = tentative[size_t(i)];
    d.cur = cur[size_t(i)]; d.ring = R[size_t(i)]; d.pos = 0;
  }
  Dev<DevSlotLayer> dtab(tab);
  Dev<DevGroup> dgrp(grp);
  Dev<int32_t> drg(b.row_group), dlist(b.list), drows(b.rows);
  StepSeqs sq;
  sq.row_group = drg.p; sq.groups = dgrp.p; sq.slots = dtab.p;
  Dev<float> dout(size_t(T) * Hv * dv);
  dout.poison();
  Dev<char> scratch(lily::cuda::gdn_scratch_bytes(g, T));
  lily::cuda::gdn_groups(g, dproj.p, T, sq, dlist.p, G, drows.p, int(b.rows.size()), dout.p, scratch.p, nullptr);
  const auto out = dout.down();
  // reference: gdn_core per group on copies of its state, `rows` rows of it
  auto single = [&](int i, int rows, std::vector<float>& o, std::vector<float>& cs, std::vector<float>& S) {
    Dev<float> dc(c0[size_t(i)]), dS(s0[size_t(i)]), dO(size_t(rows) * Hv * dv);
    Dev<char> sc(lily::cuda::gdn_scratch_bytes(g, rows));
    lily::cuda::gdn_core(g, dproj.p + size_t(b.first[size_t(i)]) * PW, rows, dc.p, dS.p, dO.p, sc.p, nullptr, 1 << 30);
    o = dO.down();
    cs = dc.down();
    S = dS.down();
  };
  for (int i = 0; i < G; ++i) {
    SCOPED_TRACE("group " + std::to_string(i) + " rows " + std::to_string(sizes[size_t(i)]) +
                 (tentative[size_t(i)] ? " tentative" : ""));
    const int n = sizes[size_t(i)];
    std::vector<float> o, cs, S;
    single(i, n, o, cs, S);
    EXPECT_LT(rel(slice(out, size_t(b.first[size_t(i)]) * Hv * dv, size_t(n) * Hv * dv), o), 1e-6);
    const auto cr = cring[size_t(i)]->down(), sr = sring[size_t(i)]->down();
    const size_t cv = size_t(cur[size_t(i)]);
    if (!tentative[size_t(i)]) {
      EXPECT_LT(rel(slice(cr, cv * cn, cn), cs), 1e-6) << "conv state written back";
      EXPECT_LT(rel(slice(sr, cv * sn, sn), S), 1e-6) << "state written back";
      continue;
    }
    EXPECT_EQ(slice(cr, cv * cn, cn), c0[size_t(i)]) << "the current version stays";
    EXPECT_EQ(slice(sr, cv * sn, sn), s0[size_t(i)]) << "the current version stays";
    for (int j = 0; j < n; ++j) {  // version cur + 1 + j: the state after row j
      single(i, j + 1, o, cs, S);
      const size_t v = size_t((cur[size_t(i)] + 1 + j) % R[size_t(i)]);
      EXPECT_LT(rel(slice(cr, v * cn, cn), cs), 1e-6) << "conv version after row " << j;
      EXPECT_LT(rel(slice(sr, v * sn, sn), S), 1e-6) << "state version after row " << j;
    }
  }
}

TEST(CudaGroups, GdnGroupsMatchOneSequenceCalls) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(21);
  const std::vector<int> sizes = {1, 3, 16, 2, 1};
  const std::vector<bool> tent = {false, true, false, true, false};
  run_gdn_groups_case(2, 4, 32, 32, 4, sizes, tent, rng);        // fused: G 2, NS 2
  run_gdn_groups_case(16, 32, 128, 128, 4, sizes, tent, rng);    // the 35B-A3B shape
  run_gdn_groups_case(2, 8, 256, 64, 2, {2, 1, 5}, {true, false, true}, rng);  // dk 256, K 2
  run_gdn_groups_case(1, 3, 64, 24, 3, sizes, tent, rng);        // G 3: no cluster split, three kernels
  run_gdn_groups_case(2, 4, 32, 32, 6, {4, 1}, {true, false}, rng);  // K 6 > the fused kernel's taps
  run_gdn_groups_case(4, 4, 64, 64, 4, {1, 1, 1, 1, 1, 1, 1}, std::vector<bool>(7, false), rng);  // decode rows
}

void run_attn_groups_case(int Hq, int Hkv, int hd, const std::vector<int>& sizes, const std::vector<int64_t>& pos,
                          int nsplit, std::mt19937& rng) {
  SCOPED_TRACE("Hq " + std::to_string(Hq) + " Hkv " + std::to_string(Hkv) + " hd " + std::to_string(hd) + " nsplit " +
               std::to_string(nsplit));
  lily::cuda::AttnDev a;
  a.Hq = Hq; a.Hkv = Hkv; a.hd = hd; a.rot = hd / 4; a.theta = 1e7f;
  Dev<float> dqn(randn(size_t(hd), rng, 0.2f)), dkn(randn(size_t(hd), rng, 0.2f));
  a.q_norm = dqn.p; a.k_norm = dkn.p;
  const int PW = a.proj_width();
  const Batch b(sizes);
  const int G = int(sizes.size()), T = b.T;
  Dev<float> dproj(randn(size_t(T) * PW, rng));
  std::vector<std::unique_ptr<Dev<uint16_t>>> kc, vc, kr, vr;
  std::vector<DevSlotLayer> tab(static_cast<size_t>(G));
  std::vector<DevGroup> grp(static_cast<size_t>(G));
  std::vector<int64_t> cap(static_cast<size_t>(G));
  for (int i = 0; i < G; ++i) {
    cap[size_t(i)] = pos[size_t(i)] + sizes[size_t(i)] + 3;
    const size_t n = size_t(Hkv) * size_t(cap[size_t(i)]) * size_t(hd);
    const auto k0 = randn_bf16(n, rng, 1.f).first, v0 = randn_bf16(n, rng, 1.f).first;
    kc.push_back(std::make_unique<Dev<uint16_t>>(k0));
    vc.push_back(std::make_unique<Dev<uint16_t>>(v0));
    kr.push_back(std::make_unique<Dev<uint16_t>>(k0));
    vr.push_back(std::make_unique<Dev<uint16_t>>(v0));
    tab[size_t(i)].k = kc.back()->p; tab[size_t(i)].v = vc.back()->p; tab[size_t(i)].cap = cap[size_t(i)];
    DevGroup& d = grp[size_t(i)];
    d.first = b.first[size_t(i)]; d.rows = sizes[size_t(i)]; d.slot = i; d.pos = pos[size_t(i)];
  }
  Dev<DevSlotLayer> dtab(tab);
  Dev<DevGroup> dgrp(grp);
  Dev<int32_t> drg(b.row_group), dlist(b.list), drows(b.rows);
  StepSeqs sq;
  sq.row_group = drg.p; sq.groups = dgrp.p; sq.slots = dtab.p;
  Dev<float> dq(size_t(T) * Hq * hd), dout(size_t(T) * Hq * hd);
  dout.poison();
  Dev<char> part(lily::cuda::attn_partials_bytes(a, T, nsplit));
  lily::cuda::attn_prep(a, dproj.p, T, sq, dq.p, nullptr);
  lily::cuda::attn_decode_groups(a, dq.p, dproj.p, T, sq, dlist.p, G, drows.p, int(b.rows.size()), nsplit, dout.p, part.p,
                                 nullptr);
  const auto out = dout.down();
  for (int i = 0; i < G; ++i) {
    SCOPED_TRACE("group " + std::to_string(i) + " rows " + std::to_string(sizes[size_t(i)]) + " at " +
                 std::to_string(pos[size_t(i)]));
    const int n = sizes[size_t(i)];
    Dev<int64_t> dpos(std::vector<int64_t>{pos[size_t(i)]});
    Dev<float> o(size_t(n) * Hq * hd);
    Dev<char> sc(lily::cuda::attn_scratch_bytes(a, n, nsplit));
    lily::cuda::attn_core(a, dproj.p + size_t(b.first[size_t(i)]) * PW, n, dpos.p, kr[size_t(i)]->p, vr[size_t(i)]->p,
                          cap[size_t(i)], nsplit, o.p, sc.p, nullptr);
    EXPECT_LT(rel(slice(out, size_t(b.first[size_t(i)]) * Hq * hd, size_t(n) * Hq * hd), o.down()), 1e-6);
    EXPECT_EQ(kc[size_t(i)]->down(), kr[size_t(i)]->down()) << "keys appended at the group's slot and position";
    EXPECT_EQ(vc[size_t(i)]->down(), vr[size_t(i)]->down()) << "values appended";
  }
}

TEST(CudaGroups, AttnDecodeGroupsMatchOneSequenceCalls) {
  LILY_REQUIRE_GPU();
  if (!lily::cuda::attn_decode_covers(256)) GTEST_SKIP() << "no decode attention kernel on this device";
  std::mt19937 rng(22);
  for (int ns : {1, 7, 66}) {
    run_attn_groups_case(16, 2, 256, {1, 1, 1, 1, 1}, {0, 7, 300, 4000, 33}, ns, rng);  // the 35B-A3B shape
    run_attn_groups_case(4, 2, 64, {1, 4, 2, 3}, {0, 5, 1000, 63}, ns, rng);            // G 2: up to 4 rows
    run_attn_groups_case(8, 8, 128, {8, 1, 5}, {17, 0, 250}, ns, rng);                  // G 1: up to 8 rows
  }
}

}  // namespace
#endif
