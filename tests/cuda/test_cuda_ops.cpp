// Each CUDA operation against a plain double-precision CPU reference, at awkward sizes.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(Cuda, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <memory>
#include <numeric>
#include <tuple>

#include "cuda_test_util.h"
#include "quant/affine/affine.h"

namespace {
using lily::cudatest::Dev;
using lily::cudatest::HighPrecisionScope;
using lily::cudatest::SwitchesScope;
using lily::cudatest::randn;
using lily::cudatest::randn_bf16;
using lily::cudatest::rel_err;

const int kRows[] = {1, 2, 3, 16, 17, 33, 63, 64, 65, 129};

std::vector<double> ref_linear(const std::vector<float>& W, int out, int in, const std::vector<float>& x, int T) {
  std::vector<double> y(size_t(T) * out);
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < in; ++i) s += double(W[size_t(o) * in + i]) * x[size_t(t) * in + i];
      y[size_t(t) * out + o] = s;
    }
  return y;
}

// Rows of many-row products as per-row GEMVs instead of GEMMs (the multi-row products of rows.h off unless
// asked for), for the duration of a scope.
struct GemvRowsScope {
  lily::cuda::KernelSwitches saved = lily::cuda::kernel_switches();
  GemvRowsScope(int dense, int moe, int rows_dense = 0, int rows_moe = 0, int rows_min = 6) {
    auto k = saved;
    k.gemv_rows = dense;
    k.moe_gemv_rows = moe;
    k.rows_dense = rows_dense;
    k.rows_moe = rows_moe;
    k.rows_min = rows_min;
    lily::cuda::set_kernel_switches(k);
  }
  ~GemvRowsScope() { lily::cuda::set_kernel_switches(saved); }
};

void linear_cases() {
  std::mt19937 rng(1);
  const std::pair<int, int> shapes[] = {{65, 136}, {1, 24}, {130, 2048}, {7, 13}};
  for (auto [out, in] : shapes)
    for (int T : kRows) {
      auto [Wb, Wf] = randn_bf16(size_t(out) * in, rng, 1.f / std::sqrt(float(in)));
      auto x = randn(size_t(T) * in, rng);
      Dev<uint16_t> dW(Wb);
      Dev<float> dx(x), dy(size_t(T) * out);
      dy.poison();
      lily::cuda::linear(dW.p, in, out, in, dx.p, in, T, dy.p, out, false, nullptr);
      auto ref = ref_linear(Wf, out, in, x, T);
      EXPECT_LT(rel_err(dy.down(), ref), 1e-5) << out << "x" << in << " T=" << T;
      // accumulate: y += x Wᵀ on top of the previous result
      lily::cuda::linear(dW.p, in, out, in, dx.p, in, T, dy.p, out, true, nullptr);
      for (auto& v : ref) v *= 2;
      EXPECT_LT(rel_err(dy.down(), ref), 1e-5) << "accumulate " << out << "x" << in << " T=" << T;
      if (T <= lily::cuda::kGemvMaxRows) {  // RMSNorm fused into the GEMV
        auto nw = randn(size_t(in), rng);
        std::vector<float> xn(x.size());
        for (int t = 0; t < T; ++t) {
          double ss = 0;
          for (int i = 0; i < in; ++i) ss += double(x[size_t(t) * in + i]) * x[size_t(t) * in + i];
          const double inv = 1 / std::sqrt(ss / in + 1e-6);
          for (int i = 0; i < in; ++i) xn[size_t(t) * in + i] = float(x[size_t(t) * in + i] * inv * nw[i]);
        }
        Dev<float> dnw(nw);
        lily::cuda::linear(lily::cuda::Mat::bf16(dW.p, in), out, in, dx.p, in, T, dy.p, out, false, nullptr, dnw.p, 1e-6f);
        EXPECT_LT(rel_err(dy.down(), ref_linear(Wf, out, in, xn, T)), 1e-5) << "fused norm " << out << "x" << in << " T=" << T;
      }
    }
}

TEST(CudaOps, LinearMatchesReference) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // fp32-class tolerances (the bf16 mode: test_cuda_gemm.cpp)
  linear_cases();
}

// Affine (MLX) 4- and 8-bit weights read packed: GEMV (T <= 2), GEMM, expert slots, embedding rows.
void affine_linear_cases() {
  std::mt19937 rng(8);
  for (int bits : {4, 8})
    for (int gs : {32, 64, 128})
      for (auto [out, in] : {std::pair{65, 256}, std::pair{3, 128}, std::pair{130, 2048}}) {
        if (in % gs) continue;
        const int E = 3;
        auto wf = randn(size_t(E) * out * in, rng, 0.05f);
        auto qz = lily::quant::affine_quantize(wf.data(), int64_t(E) * out, in, bits, gs);
        auto view = qz.view();
        std::vector<float> deq(size_t(E) * out * in);
        for (int64_t r = 0; r < int64_t(E) * out; ++r) lily::quant::affine_dequant_row_ref(view, r, deq.data() + size_t(r) * in);
        Dev<uint32_t> dq(qz.packed);
        Dev<uint16_t> ds(qz.scales), db(qz.biases);
        lily::cuda::Mat m;
        m.affine = true; m.q = dq.p; m.s = ds.p; m.b = db.p; m.bits = bits; m.gs = gs;
        m.row_words = int64_t(in) * bits / 32;
        m.qstride = int64_t(out) * m.row_words; m.sstride = int64_t(out) * (in / gs);
        for (int T : {1, 2, 3, 17, 65}) {
          auto x = randn(size_t(T) * in, rng);
          Dev<float> dx(x), dy(size_t(T) * out);
          dy.poison();
          lily::cuda::linear(m, out, in, dx.p, in, T, dy.p, out, false, nullptr);  // expert 0
          auto ref = ref_linear(deq, out, in, x, T);
          EXPECT_LT(rel_err(dy.down(), ref), 1e-5) << bits << "-bit gs " << gs << " " << out << "x" << in << " T=" << T;
        }
        // slots: slot s uses expert (2 s + 1) % E and input row s
        const int slots = 5;
        std::vector<int32_t> ex(slots);
        for (int s2 = 0; s2 < slots; ++s2) ex[s2] = (2 * s2 + 1) % E;
        auto x = randn(size_t(slots) * in, rng);
        Dev<float> dx(x), dy(size_t(slots) * out);
        Dev<int32_t> dex(ex);
        lily::cuda::gemv_slots(m, dex.p, out, in, dx.p, in, 1, slots, dy.p, out, false, 0, nullptr);
        std::vector<double> ref(size_t(slots) * out);
        for (int s2 = 0; s2 < slots; ++s2)
          for (int o = 0; o < out; ++o) {
            double acc = 0;
            for (int i = 0; i < in; ++i) acc += double(deq[(size_t(ex[s2]) * out + o) * in + i]) * x[size_t(s2) * in + i];
            ref[size_t(s2) * out + o] = acc;
          }
        EXPECT_LT(rel_err(dy.down(), ref), 1e-5) << "slots " << bits << "-bit";
        // embedding gather dequantises rows of expert 0
        std::vector<int32_t> tok{0, int32_t(out - 1), 1 % out};
        Dev<int32_t> dt(tok);
        Dev<float> de(size_t(3) * in);
        lily::cuda::embed(m, in, dt.p, 3, de.p, nullptr);
        auto e = de.down();
        for (int t = 0; t < 3; ++t)
          for (int i = 0; i < in; ++i) ASSERT_NEAR(e[size_t(t) * in + i], deq[size_t(tok[t]) * in + i], 1e-6f);
      }
}

TEST(CudaOps, AffineLinearMatchesReference) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // fp32-class tolerances (the bf16 mode: test_cuda_gemm.cpp)
  affine_linear_cases();
}

TEST(CudaOps, RmsNormEmbedArgmax) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (int T : {1, 3, 17, 65}) {
    const int H = T == 3 ? 200 : T == 17 ? 128 : 2048;  // 200: the block-per-row kernel; else warp per row
    auto x = randn(size_t(T) * H, rng, 3.f), w = randn(H, rng);
    Dev<float> dx(x), dw(w), dy(size_t(T) * H);
    dy.poison();
    lily::cuda::rmsnorm(dx.p, H, dw.p, T, H, 1e-6f, dy.p, H, nullptr);
    std::vector<double> ref(size_t(T) * H);
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int i = 0; i < H; ++i) ss += double(x[size_t(t) * H + i]) * x[size_t(t) * H + i];
      const double inv = 1.0 / std::sqrt(ss / H + 1e-6);
      for (int i = 0; i < H; ++i) ref[size_t(t) * H + i] = x[size_t(t) * H + i] * inv * w[i];
    }
    EXPECT_LT(rel_err(dy.down(), ref), 1e-6);
    // argmax with a planted tie: the lowest index wins, also when the two sit in different blocks;
    // the scratch is reused across calls (the kernel leaves it zero)
    Dev<char> scratch(lily::cuda::argmax_scratch_bytes(T));
    LILY_CU(cudaMemset(scratch.p, 0, scratch.n));
    for (int V : {1, 3001, 248320}) {
      auto l = randn(size_t(T) * V, rng);
      std::vector<int32_t> want(T);
      for (int t = 0; t < T; ++t) {
        const int a = (t * 977) % V, b = std::min(V - 1, a + (t % 2 ? 5 : V / 2));
        l[size_t(t) * V + a] = l[size_t(t) * V + b] = 100.f;
        if (t % 3 == 2 && a > 0) l[size_t(t) * V + a - 1] = std::nanf("");  // NaN never wins
        want[t] = a;
      }
      Dev<float> dl(l);
      Dev<int32_t> di(T);
      for (int rep = 0; rep < 2; ++rep) {
        di.poison();
        lily::cuda::argmax(dl.p, T, V, di.p, scratch.p, nullptr);
        EXPECT_EQ(di.down(), want) << "V=" << V << " T=" << T;
      }
    }
    // embed gathers bf16 rows
    auto [tb, tf] = randn_bf16(size_t(50) * H, rng, 1.f);
    std::vector<int32_t> tok(T);
    for (int t = 0; t < T; ++t) tok[t] = (t * 7 + 3) % 50;
    Dev<uint16_t> dt(tb);
    Dev<int32_t> dtok(tok);
    Dev<float> de(size_t(T) * H);
    lily::cuda::embed(dt.p, H, H, dtok.p, T, de.p, nullptr);
    auto e = de.down();
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < H; ++i) ASSERT_EQ(e[size_t(t) * H + i], tf[size_t(tok[t]) * H + i]);
  }
}

// ---- MoE ----
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
  // one token: also with the top-k folded into the router GEMV (twice: the counter must come back zero)
  Dev<unsigned> counter(1);
  LILY_CU(cudaMemset(counter.p, 0, sizeof(unsigned)));
  for (int fold = 0; fold <= (T == 1 ? 2 : 0); ++fold) {
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

void moe_cases() {
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

// The same products with every row count up to 64 on the GEMV paths (--cuda-opt gemv_rows / moe_gemv_rows).
TEST(CudaOps, ManyRowGemvsMatchReference) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // fp32-class tolerances (the bf16 mode: test_cuda_gemm.cpp)
  GemvRowsScope scope(64, 64);
  linear_cases();
  affine_linear_cases();
  moe_cases();
}

// ---- Gated DeltaNet ----
struct GdnRef {
  int Hk = 0, Hv = 0, dk = 0, dv = 0, K = 0;
  std::vector<float> conv, dtb, Aneg, norm;
  std::vector<double> conv_state, S;  // [K-1, C], [Hv, dv, dk]
  int C() const { return 2 * Hk * dk + Hv * dv; }
  int PW() const { return C() + Hv * dv + 2 * Hv; }
  // proj [T, PW] -> out [T, Hv*dv]
  std::vector<double> step(const std::vector<float>& proj, int T) {
    const int c = C(), pw = PW();
    std::vector<double> out(size_t(T) * Hv * dv);
    std::vector<double> hist(size_t(K - 1 + T) * c);
    for (int r = 0; r < K - 1; ++r)
      for (int i = 0; i < c; ++i) hist[size_t(r) * c + i] = conv_state[size_t(r) * c + i];
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < c; ++i) hist[size_t(K - 1 + t) * c + i] = proj[size_t(t) * pw + i];
    for (int t = 0; t < T; ++t) {
      std::vector<double> y(c);
      for (int i = 0; i < c; ++i) {
        double s = 0;
        for (int j = 0; j < K; ++j) s += double(conv[size_t(i) * K + j]) * hist[size_t(t + j) * c + i];
        y[i] = s / (1 + std::exp(-s));
      }
      const float* pr = proj.data() + size_t(t) * pw;
      for (int j = 0; j < Hv; ++j) {
        const int hk = j / (Hv / Hk);
        std::vector<double> q(dk), k(dk);
        double qq = 0, kk = 0;
        for (int i = 0; i < dk; ++i) {
          q[i] = y[hk * dk + i]; k[i] = y[Hk * dk + hk * dk + i];
          qq += q[i] * q[i]; kk += k[i] * k[i];
        }
        for (int i = 0; i < dk; ++i) { q[i] /= std::sqrt(qq + 1e-6) * std::sqrt(double(dk)); k[i] /= std::sqrt(kk + 1e-6); }
        const double beta = 1 / (1 + std::exp(-double(pr[c + Hv * dv + j])));
        const double a = double(pr[c + Hv * dv + Hv + j]) + dtb[j];
        const double g = Aneg[j] * (a > 20 ? a : std::log1p(std::exp(a)));
        std::vector<double> o(dv);
        for (int d = 0; d < dv; ++d) {
          double* s = S.data() + (size_t(j) * dv + d) * dk;
          double m = 0;
          for (int i = 0; i < dk; ++i) { s[i] *= std::exp(g); m += s[i] * k[i]; }
          const double delta = beta * (y[2 * Hk * dk + j * dv + d] - m);
          double ov = 0;
          for (int i = 0; i < dk; ++i) { s[i] += k[i] * delta; ov += s[i] * q[i]; }
          o[d] = ov;
        }
        double ss = 0;
        for (int d = 0; d < dv; ++d) ss += o[d] * o[d];
        const double inv = 1 / std::sqrt(ss / dv + 1e-6);
        for (int d = 0; d < dv; ++d) {
          const double z = pr[c + j * dv + d];
          out[size_t(t) * Hv * dv + size_t(j) * dv + d] = o[d] * inv * norm[d] * z / (1 + std::exp(-z));
        }
      }
    }
    for (int r = 0; r < K - 1; ++r)
      for (int i = 0; i < c; ++i) conv_state[size_t(r) * c + i] = hist[size_t(T + r) * c + i];
    return out;
  }
};

// ba_in > 0: b|a come from a bf16 product W [2·Hv, ba_in] of RMSNorm(x)·nw handed to gdn_core (computed
// inside the step kernel for one token, by a GEMV otherwise); proj's b|a columns start as NaN on the device.
void run_gdn_case(int Hk, int Hv, int dk, int dv, const std::vector<int>& steps, int chunk_min, std::mt19937& rng,
                  int ba_in = 0) {
  GdnRef R;
  R.Hk = Hk; R.Hv = Hv; R.dk = dk; R.dv = dv; R.K = 4;
  R.conv = randn(size_t(R.C()) * 4, rng, 0.5f);
  R.dtb = randn(Hv, rng, 0.5f);
  R.Aneg.resize(Hv);
  for (int j = 0; j < Hv; ++j) R.Aneg[j] = -std::exp(std::uniform_real_distribution<float>(-1.f, 1.f)(rng));
  R.norm = randn(dv, rng, 0.3f);
  for (auto& v : R.norm) v += 1.f;
  R.conv_state.assign(size_t(3) * R.C(), 0.0);
  R.S.assign(size_t(Hv) * dv * dk, 0.0);
  Dev<float> dconv(R.conv), ddtb(R.dtb), dA(R.Aneg), dnorm(R.norm);
  Dev<float> dcs(size_t(3) * R.C()), dS(size_t(Hv) * dv * dk);
  LILY_CU(cudaMemset(dcs.p, 0, dcs.n * 4));
  LILY_CU(cudaMemset(dS.p, 0, dS.n * 4));
  lily::cuda::GdnDev g;
  g.Hk = Hk; g.Hv = Hv; g.dk = dk; g.dv = dv; g.K = 4;
  g.conv = dconv.p; g.dt_bias = ddtb.p; g.A_neg = dA.p; g.norm = dnorm.p;
  std::vector<uint16_t> Wb;
  std::vector<float> Wf, nw;
  if (ba_in > 0) {
    std::tie(Wb, Wf) = randn_bf16(size_t(2) * Hv * ba_in, rng, 2.f / std::sqrt(float(ba_in)));
    nw = randn(ba_in, rng, 0.3f);
    for (auto& v : nw) v += 1.f;
  }
  Dev<uint16_t> dW(Wb);
  Dev<float> dnw(nw);
  const lily::cuda::Mat Wm = lily::cuda::Mat::bf16(dW.p, ba_in);
  for (int T : steps) {
    auto proj = randn(size_t(T) * R.PW(), rng);
    std::vector<float> x;
    lily::cuda::GdnBa ba;
    const int cb = R.C() + Hv * dv;  // first b|a column of proj
    auto dev_proj = proj;
    if (ba_in > 0) {
      x = randn(size_t(T) * ba_in, rng, 2.f);
      for (int t = 0; t < T; ++t) {
        double ss = 0;
        for (int i = 0; i < ba_in; ++i) ss += double(x[size_t(t) * ba_in + i]) * x[size_t(t) * ba_in + i];
        const double inv = 1 / std::sqrt(ss / ba_in + 1e-6);
        for (int r = 0; r < 2 * Hv; ++r) {
          double acc = 0;
          for (int i = 0; i < ba_in; ++i)
            acc += double(x[size_t(t) * ba_in + i]) * inv * nw[size_t(i)] * Wf[size_t(r) * ba_in + i];
          proj[size_t(t) * R.PW() + cb + r] = float(acc);
          dev_proj[size_t(t) * R.PW() + cb + r] = std::nanf("");
        }
      }
    }
    // as the model: the GEMVs of one or two rows normalise x themselves, longer steps get it normalised
    const bool fused = T <= 2;
    if (ba_in > 0 && !fused)
      for (int t = 0; t < T; ++t) {
        double ss = 0;
        for (int i = 0; i < ba_in; ++i) ss += double(x[size_t(t) * ba_in + i]) * x[size_t(t) * ba_in + i];
        const double inv = 1 / std::sqrt(ss / ba_in + 1e-6);
        for (int i = 0; i < ba_in; ++i) x[size_t(t) * ba_in + i] = float(x[size_t(t) * ba_in + i] * inv * nw[size_t(i)]);
      }
    Dev<float> dp(dev_proj), dout(size_t(T) * Hv * dv), dx(x);
    if (ba_in > 0) {
      ba.W = &Wm; ba.in = ba_in; ba.x = dx.p; ba.ldx = ba_in; ba.norm_w = fused ? dnw.p : nullptr; ba.eps = 1e-6f;
    }
    Dev<char> scratch(lily::cuda::gdn_scratch_bytes(g, T));
    dout.poison();
    lily::cuda::gdn_core(g, dp.p, T, dcs.p, dS.p, dout.p, scratch.p, nullptr, chunk_min, ba_in > 0 ? &ba : nullptr);
    auto ref = R.step(proj, T);
    EXPECT_LT(rel_err(dout.down(), ref), 2e-4) << "dk=" << dk << " T=" << T << " chunk_min=" << chunk_min;
    EXPECT_LT(rel_err(dS.down(), R.S), 2e-4) << "state dk=" << dk << " T=" << T;
    EXPECT_LT(rel_err(dcs.down(), R.conv_state), 1e-6) << "conv state T=" << T;
  }
}

TEST(CudaOps, GdnRecurrentMatchesReference) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // the b|a products of many-row steps: fp32-class tolerances
  std::mt19937 rng(4);
  run_gdn_case(2, 4, 32, 32, {1, 2, 1, 3, 17, 1}, 1 << 30, rng);
  run_gdn_case(2, 4, 128, 128, {1, 2, 33, 1}, 1 << 30, rng);
  run_gdn_case(1, 2, 64, 48, {3, 1, 5}, 1 << 30, rng);
  run_gdn_case(4, 4, 64, 64, {1, 2, 16, 1}, 1 << 30, rng);   // one value head per key head (fused step)
  run_gdn_case(1, 4, 32, 32, {1, 3, 1}, 1 << 30, rng);       // four value heads per key head (fused step)
  run_gdn_case(2, 4, 256, 64, {1, 2}, 1 << 30, rng);         // dk 256 (fused step, 2 rows per warp)
  // Fused step kernel (clusters of G·NS CTAs per key head) at the decode shapes and the awkward ones;
  // the comments give the cluster split (value heads G, slices NS, rows per CTA R).
  run_gdn_case(16, 32, 128, 128, {1, 2, 1, 3, 16, 1}, 1 << 30, rng);  // Qwen3.5-35B-A3B, Qwen3-Next: G 2, NS 4, R 32
  run_gdn_case(2, 2, 128, 128, {1, 16, 2, 1}, 1 << 30, rng);          // G 1, NS 8, R 16
  run_gdn_case(2, 8, 128, 128, {1, 5, 16, 1}, 1 << 30, rng);          // G 4, NS 2, R 64 (8 rows per warp)
  run_gdn_case(2, 4, 256, 128, {1, 16, 3}, 1 << 30, rng);             // dk 256: G 2, NS 4, R 32
  run_gdn_case(2, 8, 256, 64, {2, 1, 16}, 1 << 30, rng);              // dk 256, G 4: NS 2, R 32
  run_gdn_case(1, 4, 256, 128, {2, 1, 16}, 1 << 30, rng);             // dk 256, G 4, dv 128: unfused (columns a lane)
  run_gdn_case(2, 4, 64, 48, {1, 16, 2}, 1 << 30, rng);               // dv 48: G 2, NS 2, R 24 (3 of 4 row groups live)
  run_gdn_case(3, 3, 32, 48, {1, 4, 1}, 1 << 30, rng);                // dv 48, G 1: NS 2, R 24
  run_gdn_case(1, 4, 64, 32, {1, 2, 16}, 1 << 30, rng);               // dv 32, G 4: NS 2, R 16
  run_gdn_case(1, 8, 32, 64, {1, 3}, 1 << 30, rng);                   // G 8: NS 1, R 64 (cluster of 8)
  run_gdn_case(1, 8, 32, 128, {1, 3, 1}, 1 << 30, rng);               // G 8, dv 128: R 128 too many rows (unfused)
  run_gdn_case(2, 4, 32, 32, {1, 2, 16}, 1 << 30, rng);               // dk 32, G 2: NS 2, R 16 (two columns a lane)
  run_gdn_case(16, 32, 128, 128, {16, 1}, 8, rng);                    // T >= chunk_min: unfused, state carried on
  // b|a handed to gdn_core: inside the step kernel for one token (hidden 2048 and awkward widths), a GEMV
  // for longer steps and the widths the step kernel does not take
  run_gdn_case(16, 32, 128, 128, {1, 1, 3, 1}, 1 << 30, rng, 2048);
  run_gdn_case(2, 4, 64, 48, {1, 2, 1}, 1 << 30, rng, 136);
  run_gdn_case(1, 2, 32, 32, {1, 17, 1}, 8, rng, 4096);
  run_gdn_case(2, 4, 32, 32, {1, 2}, 1 << 30, rng, 4104);  // past the fold's width: GEMV
}

TEST(CudaOps, GdnChunkedMatchesReference) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // the b|a products of many-row steps: fp32-class tolerances
  std::mt19937 rng(5);
  // chunked steps (>= 16 rows) interleaved with recurrent ones, carrying both states
  run_gdn_case(2, 4, 32, 32, {17, 1, 63, 64, 65, 2, 129}, 16, rng);
  run_gdn_case(2, 4, 128, 128, {150, 1, 65}, 16, rng);
  run_gdn_case(1, 2, 64, 48, {16, 33}, 16, rng);
}

// ---- attention ----
struct AttnRef {
  int Hq = 0, Hkv = 0, hd = 0, rot = 0;
  float theta = 1e4f;
  std::vector<float> qn, kn;
  std::vector<std::vector<double>> K, V;  // per kv head: rows of hd (bf16-rounded, as cached)
  int PW() const { return Hq * 2 * hd + 2 * Hkv * hd; }
  std::vector<double> normrope(const float* src, const std::vector<float>& w, int64_t p, bool round) {
    std::vector<double> v(hd);
    double ss = 0;
    for (int d = 0; d < hd; ++d) ss += double(src[d]) * src[d];
    const double inv = 1 / std::sqrt(ss / hd + 1e-6);
    for (int d = 0; d < hd; ++d) v[d] = src[d] * inv * w[d];
    std::vector<double> r = v;
    const int half = rot / 2;
    for (int i = 0; i < half; ++i) {
      const double f = double(float(p) * (1.f / std::pow(theta, float(2 * i) / float(rot))));
      r[i] = v[i] * std::cos(f) - v[i + half] * std::sin(f);
      r[i + half] = v[i + half] * std::cos(f) + v[i] * std::sin(f);
    }
    if (round)
      for (auto& x : r) x = lily::cudatest::bf16_round(float(x));
    return r;
  }
  std::vector<double> step(const std::vector<float>& proj, int T) {
    const int64_t p0 = int64_t(K[0].size()) / hd;
    std::vector<double> out(size_t(T) * Hq * hd);
    for (int t = 0; t < T; ++t) {
      const float* pr = proj.data() + size_t(t) * PW();
      for (int h = 0; h < Hkv; ++h) {
        auto k = normrope(pr + Hq * 2 * hd + h * hd, kn, p0 + t, true);
        K[h].insert(K[h].end(), k.begin(), k.end());
        for (int d = 0; d < hd; ++d) V[h].push_back(lily::cudatest::bf16_round(pr[Hq * 2 * hd + Hkv * hd + h * hd + d]));
      }
    }
    for (int t = 0; t < T; ++t) {
      const float* pr = proj.data() + size_t(t) * PW();
      const int64_t n = p0 + t + 1;
      for (int h = 0; h < Hq; ++h) {
        const int kh = h / (Hq / Hkv);
        auto q = normrope(pr + h * 2 * hd, qn, p0 + t, false);
        std::vector<double> s(n);
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += q[d] * K[kh][size_t(j) * hd + d];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        for (auto& x : s) { x = std::exp(x - mx); l += x; }
        for (int d = 0; d < hd; ++d) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j) o += s[j] * V[kh][size_t(j) * hd + d];
          const double gt = pr[h * 2 * hd + hd + d];
          out[size_t(t) * Hq * hd + size_t(h) * hd + d] = o / l / (1 + std::exp(-gt));
        }
      }
    }
    return out;
  }
};

// Steps of T rows through attn_core against the reference. p0 > 0: the cache first gets p0 random bf16 keys
// written straight into it (the reference for a prompt that long would take minutes; only decode steps,
// G·T <= 8, follow), and rows past the live keys hold NaN, so reading one shows up.
void run_attn_case(int Hq, int Hkv, int hd, int rot, const std::vector<int>& steps, int forced_split, std::mt19937& rng,
                   int64_t p0 = 0) {
  AttnRef R;
  R.Hq = Hq; R.Hkv = Hkv; R.hd = hd; R.rot = rot; R.theta = 1e6f;
  R.qn = randn(hd, rng, 0.2f);
  R.kn = randn(hd, rng, 0.2f);
  for (auto& v : R.qn) v += 1.f;
  for (auto& v : R.kn) v += 1.f;
  R.K.assign(Hkv, {});
  R.V.assign(Hkv, {});
  int64_t cap = p0 > 0 ? p0 + 8 : 0;
  for (int T : steps) cap += T;
  Dev<float> dqn(R.qn), dkn(R.kn);
  Dev<uint16_t> kc(size_t(Hkv) * cap * hd), vc(size_t(Hkv) * cap * hd);
  if (p0 > 0) {
    kc.poison();
    vc.poison();
    for (int h = 0; h < Hkv; ++h) {
      const auto k = randn_bf16(size_t(p0) * hd, rng, 1.f), v = randn_bf16(size_t(p0) * hd, rng, 2.f);
      LILY_CU(cudaMemcpy(kc.p + size_t(h) * cap * hd, k.first.data(), k.first.size() * 2, cudaMemcpyHostToDevice));
      LILY_CU(cudaMemcpy(vc.p + size_t(h) * cap * hd, v.first.data(), v.first.size() * 2, cudaMemcpyHostToDevice));
      R.K[h].assign(k.second.begin(), k.second.end());
      R.V[h].assign(v.second.begin(), v.second.end());
    }
  }
  Dev<int64_t> pos(std::vector<int64_t>{p0});
  lily::cuda::AttnDev a;
  a.Hq = Hq; a.Hkv = Hkv; a.hd = hd; a.rot = rot; a.theta = 1e6f; a.q_norm = dqn.p; a.k_norm = dkn.p;
  int64_t n = p0;
  for (int T : steps) {
    if (p0 > 0) {
      ASSERT_LE((Hq / Hkv) * T, 8) << "decode steps only after the directly written keys";
    }
    auto proj = randn(size_t(T) * R.PW(), rng, 2.f);
    const int ns = forced_split > 0 ? forced_split : lily::cuda::attn_splits(a, T, n + T);
    Dev<float> dp(proj), dout(size_t(T) * Hq * hd);
    Dev<char> scratch(lily::cuda::attn_scratch_bytes(a, T, ns));
    dout.poison();
    lily::cuda::attn_core(a, dp.p, T, pos.p, kc.p, vc.p, cap, ns, dout.p, scratch.p, nullptr);
    lily::cuda::advance_pos(pos.p, T, nullptr);
    // prompts (more than 8 packed rows) run on the tensor cores with bf16 q and p operands
    // (test_cuda_attn_prefill.cpp says why 4e-3); decode keeps ~2^-16 (q and p split into two bf16 parts)
    const double tol = (Hq / Hkv) * T > 8 ? 4e-3 : 1e-4;
    EXPECT_LT(rel_err(dout.down(), R.step(proj, T)), tol)
        << "Hq=" << Hq << " Hkv=" << Hkv << " hd=" << hd << " T=" << T << " ctx=" << n << " splits=" << ns;
    n += T;
  }
}

TEST(CudaOps, AttentionMatchesReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(6);
  for (int split : {0, 1, 7}) {
    run_attn_case(4, 2, 64, 16, {17, 1, 1, 65, 3, 2, 129, 1}, split, rng);
    run_attn_case(8, 1, 256, 64, {33, 1, 63, 1}, split, rng);
    run_attn_case(16, 2, 128, 32, {1, 16, 1}, split, rng);
  }
}

TEST(CudaOps, AttentionDecodeMatchesReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (int split : {0, 1, 7}) {
    // Qwen3.5-35B-A3B: Hq 16, Hkv 2 (G 8), hd 256; decode at 601, 602 and 903 keys
    run_attn_case(16, 2, 256, 64, {600, 1, 1, 300, 1}, split, rng);
    // G 2, T up to 4 (R = 2T): decode at 1, 32-33, 62-63, 64, 65, 126-129, 130-132 keys
    run_attn_case(4, 2, 128, 32, {1, 30, 2, 28, 2, 1, 1, 60, 4, 3}, split, rng);
    run_attn_case(4, 2, 256, 64, {1, 30, 2, 28, 2, 1, 1, 60, 4, 3}, split, rng);
    // G 1 (R = T up to 8) and G 4 (T up to 2)
    run_attn_case(2, 2, 64, 16, {8, 23, 2, 31, 1, 64, 7}, split, rng);
    run_attn_case(8, 2, 64, 32, {2, 29, 2, 30, 1, 1}, split, rng);
    run_attn_case(16, 2, 256, 64, {1, 1, 1}, split, rng, 4095);
  }
  run_attn_case(16, 2, 256, 64, {1, 1}, 0, rng, 30000);
  run_attn_case(16, 2, 256, 64, {1}, 128, rng, 30000);  // the most splits attn_core takes
  run_attn_case(8, 1, 256, 64, {1, 1}, 0, rng, 9000);    // one KV head: the splits fill the SMs alone
  run_attn_case(4, 2, 128, 32, {4, 1, 3}, 0, rng, 5000);
  run_attn_case(2, 2, 64, 16, {8, 5}, 3, rng, 3001);
}

}  // namespace
#endif
