// The MoE block on CUDA (router, top-k, routed and shared experts, fused RMSNorm, the shared expert in the
// stacks, grouped many-row products) against a double-precision CPU reference.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaMoe, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <memory>
#include <numeric>

#include "ops_cases.h"

namespace {
using lily::cudatest::GemvRowsScope;
using lily::cudatest::moe_cases;
using lily::cudatest::Dev;
using lily::cudatest::HighPrecisionScope;
using lily::cudatest::randn;
using lily::cudatest::randn_bf16;
using lily::cudatest::rel_err;

struct MoeHost {
  int E = 0, k = 0, I = 0, Is = 0, H = 0;
  bool norm_topk = true, moe = true, gated = true;
  std::vector<float> router, gu, down, sgu, sdown, sgate;
};

std::vector<double> ref_moe(const MoeHost& m, const std::vector<float>& u, int T) {
  std::vector<double> y(size_t(T) * m.H, 0.0);
  auto mlp = [&](const float* gu, const float* dn, int I, const float* x, double w, double* out) {
    std::vector<double> h(I);
    for (int r = 0; r < I; ++r) {
      double g = 0, v = 0;
      for (int i = 0; i < m.H; ++i) { g += double(gu[size_t(r) * m.H + i]) * x[i]; v += double(gu[size_t(r + I) * m.H + i]) * x[i]; }
      h[r] = g / (1 + std::exp(-g)) * v;
    }
    for (int o = 0; o < m.H; ++o) {
      double s = 0;
      for (int r = 0; r < I; ++r) s += double(dn[size_t(o) * I + r]) * h[r];
      out[o] += w * s;
    }
  };
  for (int t = 0; t < T; ++t) {
    const float* x = u.data() + size_t(t) * m.H;
    double* out = y.data() + size_t(t) * m.H;
    if (m.moe) {
      std::vector<double> lg(m.E);
      for (int e = 0; e < m.E; ++e) {
        double s = 0;
        for (int i = 0; i < m.H; ++i) s += double(m.router[size_t(e) * m.H + i]) * x[i];
        lg[e] = s;
      }
      std::vector<int> order(m.E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lg[a] > lg[b]; });
      const double mx = lg[order[0]];
      double all = 0, sel = 0;
      for (int e = 0; e < m.E; ++e) all += std::exp(lg[e] - mx);
      for (int j = 0; j < m.k; ++j) sel += std::exp(lg[order[j]] - mx);
      for (int j = 0; j < m.k; ++j) {
        const int e = order[j];
        const double w = std::exp(lg[e] - mx) / (m.norm_topk ? sel : all);
        mlp(m.gu.data() + size_t(e) * 2 * m.I * m.H, m.down.data() + size_t(e) * m.H * m.I, m.I, x, w, out);
      }
    }
    if (m.Is > 0) {
      double g = 1;
      if (m.gated) {
        double s = 0;
        for (int i = 0; i < m.H; ++i) s += double(m.sgate[i]) * x[i];
        g = 1 / (1 + std::exp(-s));
      }
      mlp(m.sgu.data(), m.sdown.data(), m.Is, x, g, out);
    }
  }
  return y;
}

// stacked: the shared expert rides in the routed stacks as expert E and its gate as router row E
// (MoeDev::shared_in_stack, gate_in_router); needs Is == I.
// I, Is: expert and shared-expert widths (multiples of 64 reach the multi-row products of rows.h).
// fused (T <= 2): moe() normalises x itself (u == null, a norm weight), u = RMSNorm(x0) · nw.
void run_moe_case(int T, bool norm_topk, bool skewed, bool moe, int E, int k, std::mt19937& rng, bool stacked = false,
                  int I = 40, int Is = 24, bool fused = false) {
  MoeHost m;
  m.E = E; m.k = k; m.I = I; m.Is = stacked ? I : Is; m.H = 64; m.norm_topk = norm_topk;
  m.moe = moe;
  using DB = std::unique_ptr<Dev<uint16_t>>;
  DB dr, dgu, ddn, dsgu, dsdn, dsg;
  auto mk = [&](std::vector<float>& f, size_t n, float sc, DB& d) {
    auto [b, v] = randn_bf16(n, rng, sc);
    f = v;
    d = std::make_unique<Dev<uint16_t>>(b);
  };
  mk(m.router, size_t(E) * m.H, 1.f, dr);
  if (skewed) {  // experts 0 and 1 win for almost every token: several experts get no rows
    std::vector<uint16_t> rb(m.router.size());
    for (int e = 0; e < E; ++e)
      for (int i = 0; i < m.H; ++i) {
        float v = m.router[size_t(e) * m.H + i] * (e < 2 ? 1.f : 0.05f);
        rb[size_t(e) * m.H + i] = lily::f32_to_bf16(v);
        m.router[size_t(e) * m.H + i] = lily::bf16_to_f32(rb[size_t(e) * m.H + i]);
      }
    dr->up(rb);
  }
  mk(m.gu, size_t(E) * 2 * m.I * m.H, 0.125f, dgu);
  mk(m.down, size_t(E) * m.H * m.I, 0.15f, ddn);
  mk(m.sgu, size_t(2) * m.Is * m.H, 0.125f, dsgu);
  mk(m.sdown, size_t(m.H) * m.Is, 0.2f, dsdn);
  mk(m.sgate, size_t(m.H), 0.125f, dsg);
  auto u = randn(size_t(T) * m.H, rng);
  auto x0 = randn(size_t(T) * m.H, rng);
  auto nw = randn(size_t(m.H), rng);
  if (fused)
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int i = 0; i < m.H; ++i) ss += double(x0[size_t(t) * m.H + i]) * x0[size_t(t) * m.H + i];
      const double inv = 1 / std::sqrt(ss / m.H + 1e-6);
      for (int i = 0; i < m.H; ++i) u[size_t(t) * m.H + i] = float(x0[size_t(t) * m.H + i] * inv * nw[size_t(i)]);
    }
  Dev<float> dnw(nw);
  lily::cuda::MoeDev md;
  md.moe = moe; md.E = E; md.k = k; md.I = m.I; md.Is = m.Is; md.H = m.H; md.norm_topk = norm_topk;
  using lily::cuda::Mat;
  md.router = Mat::bf16(dr->p, m.H);
  md.gate_up = Mat::bf16(dgu->p, m.H, int64_t(2) * m.I * m.H);
  md.down = Mat::bf16(ddn->p, m.I, int64_t(m.H) * m.I);
  md.sh_gate_up = Mat::bf16(dsgu->p, m.H);
  md.sh_down = Mat::bf16(dsdn->p, m.Is);
  if (moe) md.sh_gate = Mat::bf16(dsg->p, m.H);
  m.gated = moe;
  std::unique_ptr<Dev<uint16_t>> st_r, st_gu, st_dn;
  if (stacked) {  // device stacks of E + 1 experts / router rows, rebuilt from the same bf16 values
    auto bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      std::vector<uint16_t> o;
      for (float v : a) o.push_back(lily::f32_to_bf16(v));
      for (float v : b) o.push_back(lily::f32_to_bf16(v));
      return o;
    };
    st_r = std::make_unique<Dev<uint16_t>>(bits(m.router, m.sgate));
    st_gu = std::make_unique<Dev<uint16_t>>(bits(m.gu, m.sgu));
    st_dn = std::make_unique<Dev<uint16_t>>(bits(m.down, m.sdown));
    md.router = Mat::bf16(st_r->p, m.H);
    md.gate_up = Mat::bf16(st_gu->p, m.H, int64_t(2) * m.I * m.H);
    md.down = Mat::bf16(st_dn->p, m.I, int64_t(m.H) * m.I);
    md.sh_gate = md.router;
    md.gate_in_router = true;
    md.shared_in_stack = true;
    md.sh_gate_up = Mat{};
    md.sh_down = Mat{};
  }
  auto ref = ref_moe(m, u, T);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += x0[i];
  // 1-4 tokens: also with the top-k folded into the router GEMV (twice: the counter must come back zero)
  Dev<unsigned> counter(1);
  LILY_CU(cudaMemset(counter.p, 0, sizeof(unsigned)));
  for (int fold = 0; fold <= (T <= lily::cuda::kTopkFoldRows ? 2 : 0); ++fold) {
    md.topk_counter = fold ? counter.p : nullptr;
    Dev<float> du(u), dx(x0);
    Dev<char> scratch(lily::cuda::moe_scratch_bytes(md, T));
    scratch.poison();
    lily::cuda::moe(md, fused ? nullptr : du.p, T, dx.p, scratch.p, nullptr, nullptr, nullptr, nullptr, dnw.p, 1e-6f);
    EXPECT_LT(rel_err(dx.down(), ref), 2e-5) << "T=" << T << " norm_topk=" << norm_topk << " skewed=" << skewed
                                              << " moe=" << moe << " stacked=" << stacked << " fold=" << fold;
  }
  EXPECT_EQ(counter.down()[0], 0u);
}

}  // namespace

void lily::cudatest::moe_cases() {
  std::mt19937 rng(3);
  for (int T : {1, 2, 3, 4, 5, 16, 17, 33, 63, 64, 65, 129}) {
    run_moe_case(T, true, false, true, 8, 2, rng);
    run_moe_case(T, true, true, true, 8, 2, rng);
  }
  for (int T : {1, 17, 130}) {
    run_moe_case(T, false, false, true, 8, 2, rng);
    run_moe_case(T, true, false, false, 8, 2, rng);  // dense MLP
    run_moe_case(T, true, false, true, 40, 5, rng);  // several tiles per expert at T=130
  }
  run_moe_case(2048, true, true, true, 8, 2, rng);  // ~2000 rows on two experts, none on six
  for (int T : {1, 2, 3, 17, 65, 129}) {  // shared expert as expert E of the stacks
    run_moe_case(T, true, false, true, 8, 2, rng, true);
    run_moe_case(T, false, true, true, 40, 5, rng, true);
  }
}

namespace {

TEST(CudaOps, MoeMatchesReference) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // fp32-class tolerances (the bf16 mode: test_cuda_gemm.cpp)
  moe_cases();
}

// Steps of 3..32 rows grouped per expert into the multi-row products (rows.h, rows_min 3 here): experts chosen
// by none (skewed routing), by one row, by every row (the shared expert in the stacks), by more rows than a
// tile; 1-2 rows with the fused RMSNorm stay on the GEMVs.
TEST(CudaOps, MoeGroupedRowsMatchReference) {
  LILY_REQUIRE_GPU();
  GemvRowsScope scope(16, 32, 32, 32, 3);
  std::mt19937 rng(4);
  for (int T : {2, 3, 5, 8, 16, 17, 32}) {
    run_moe_case(T, true, false, true, 8, 2, rng, false, 64, 128);
    run_moe_case(T, true, true, true, 8, 2, rng, false, 64, 64);
    run_moe_case(T, false, false, true, 40, 5, rng, false, 128, 64);
    run_moe_case(T, true, false, false, 8, 2, rng, false, 64, 128);  // dense MLP
    run_moe_case(T, true, false, true, 8, 2, rng, true, 64);         // shared expert as expert E
    run_moe_case(T, false, true, true, 40, 5, rng, true, 64);
  }
  for (int T : {1, 2}) {  // the RMSNorm fused into the GEMVs
    run_moe_case(T, true, false, true, 8, 2, rng, false, 64, 128, true);
    run_moe_case(T, true, true, true, 8, 2, rng, true, 64, 64, true);
    run_moe_case(T, true, false, false, 8, 2, rng, false, 64, 128, true);
  }
}

}  // namespace
#endif
