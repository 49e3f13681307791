// Prompt attention on the tensor cores (attn_prefill.cu) through attn_core, against a double-precision
// reference and against the SIMT fp32 kernel of attn.cu; plus a timing of the Qwen3.5-35B-A3B shape.
//
// Tolerance: the kernel feeds the tensor cores bf16 operands: q (rounded from fp32, relative error
// <= 2^-9, RMS ~1.1e-3) in q·k, and the softmax weights p (same rounding) in p·v; K and V are bf16 in
// the cache for the reference too. Each rounding perturbs a score or a weight by an independent
// relative ~1e-3, which moves a row's output by about that much relative to its norm (the output and
// the error are both weighted sums of the same values). So ~1.5e-3 is expected; we allow 4e-3 on the
// whole output and 1.2e-2 on any single (token, head) row. A masking or indexing error (one key too
// many or too few, a wrong KV head or gate) moves single rows by far more than 1e-2.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaAttnPrefill, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/attn_prefill.h"
#include "cuda_test_util.h"

namespace {
using lily::cudatest::bf16_round;
using lily::cudatest::Dev;
using lily::cudatest::randn;
using lily::cudatest::randn_bf16;
using lily::cudatest::rel_err;

struct Shape {
  int Hq, Hkv, hd, rot;
};

// One prompt of T rows after p0 cached tokens: random norms, proj and cache prefix.
struct PrefillCase {
  Shape sh;
  int64_t p0 = 0;
  int T = 0;
  int64_t cap = 0;
  float theta = 1e6f;
  std::vector<float> qn, kn, proj;
  std::vector<uint16_t> kpre, vpre;  // [Hkv][p0][hd] bf16 bits
  int PW() const { return sh.Hq * 2 * sh.hd + 2 * sh.Hkv * sh.hd; }

  PrefillCase(Shape s, int64_t pos0, int rows, std::mt19937& rng) : sh(s), p0(pos0), T(rows), cap(pos0 + rows + 7) {
    qn = randn(sh.hd, rng, 0.2f);
    kn = randn(sh.hd, rng, 0.2f);
    for (auto& v : qn) v += 1.f;
    for (auto& v : kn) v += 1.f;
    proj = randn(size_t(T) * PW(), rng, 2.f);
    kpre = randn_bf16(size_t(sh.Hkv) * p0 * sh.hd, rng, 1.f).first;
    vpre = randn_bf16(size_t(sh.Hkv) * p0 * sh.hd, rng, 2.f).first;
  }

  lily::cuda::AttnDev dev(const float* dqn, const float* dkn) const {
    lily::cuda::AttnDev a;
    a.Hq = sh.Hq; a.Hkv = sh.Hkv; a.hd = sh.hd; a.rot = sh.rot; a.theta = theta; a.q_norm = dqn; a.k_norm = dkn;
    return a;
  }

  // Runs attn_core (nsplit <= 0: attn_splits' choice) and returns out [T][Hq·hd].
  std::vector<float> run(int nsplit, bool simt) const {
    const int hd = sh.hd;
    Dev<float> dqn(qn), dkn(kn), dp(proj), dout(size_t(T) * sh.Hq * hd);
    // cache rows past p0 + T stay NaN: reading them would poison the output
    Dev<uint16_t> kc(size_t(sh.Hkv) * cap * hd), vc(size_t(sh.Hkv) * cap * hd);
    kc.poison();
    vc.poison();
    for (int h = 0; h < sh.Hkv && p0 > 0; ++h) {
      const size_t n = size_t(p0) * hd;
      LILY_CU(cudaMemcpy(kc.p + size_t(h) * cap * hd, kpre.data() + h * n, n * 2, cudaMemcpyHostToDevice));
      LILY_CU(cudaMemcpy(vc.p + size_t(h) * cap * hd, vpre.data() + h * n, n * 2, cudaMemcpyHostToDevice));
    }
    Dev<int64_t> pos(std::vector<int64_t>{p0});
    const auto a = dev(dqn.p, dkn.p);
    const int ns = nsplit > 0 ? nsplit : lily::cuda::attn_splits(a, T, p0 + T);
    Dev<char> scratch(lily::cuda::attn_scratch_bytes(a, T, ns));
    dout.poison();
    lily::cuda::set_attn_prefill_simt(simt);
    lily::cuda::attn_core(a, dp.p, T, pos.p, kc.p, vc.p, cap, ns, dout.p, scratch.p, nullptr);
    lily::cuda::set_attn_prefill_simt(false);
    return dout.down();
  }

  // q/k RMSNorm + NeoX partial RoPE at position p, in double (angle formed in fp32 as the kernel does).
  std::vector<double> normrope(const float* src, const std::vector<float>& w, int64_t p) const {
    const int hd = sh.hd, half = sh.rot / 2;
    double ss = 0;
    for (int d = 0; d < hd; ++d) ss += double(src[d]) * src[d];
    const double inv = 1 / std::sqrt(ss / hd + 1e-6);
    std::vector<double> v(hd), r(hd);
    for (int d = 0; d < hd; ++d) v[d] = r[d] = src[d] * inv * w[d];
    for (int i = 0; i < half; ++i) {
      const double f = double(float(p) * (1.f / std::pow(theta, float(2 * i) / float(sh.rot))));
      r[i] = v[i] * std::cos(f) - v[i + half] * std::sin(f);
      r[i + half] = v[i + half] * std::cos(f) + v[i] * std::sin(f);
    }
    return r;
  }

  // Reference rows for the tokens in `rows`: ref[j] = out row (token rows[j]) [Hq·hd].
  std::vector<std::vector<double>> reference(const std::vector<int>& rows) const {
    const int hd = sh.hd, Hq = sh.Hq, Hkv = sh.Hkv, G = Hq / Hkv;
    const int64_t n = p0 + T;
    std::vector<std::vector<double>> K(Hkv, std::vector<double>(size_t(n) * hd)), V = K;
    for (int h = 0; h < Hkv; ++h) {
      for (int64_t j = 0; j < p0; ++j)
        for (int d = 0; d < hd; ++d) {
          K[h][size_t(j) * hd + d] = lily::bf16_to_f32(kpre[(size_t(h) * p0 + j) * hd + d]);
          V[h][size_t(j) * hd + d] = lily::bf16_to_f32(vpre[(size_t(h) * p0 + j) * hd + d]);
        }
      for (int t = 0; t < T; ++t) {
        const float* pr = proj.data() + size_t(t) * PW();
        const auto k = normrope(pr + Hq * 2 * hd + h * hd, kn, p0 + t);
        for (int d = 0; d < hd; ++d) {
          K[h][size_t(p0 + t) * hd + d] = bf16_round(float(k[d]));
          V[h][size_t(p0 + t) * hd + d] = bf16_round(pr[Hq * 2 * hd + Hkv * hd + h * hd + d]);
        }
      }
    }
    std::vector<std::vector<double>> out;
    for (int t : rows) {
      const float* pr = proj.data() + size_t(t) * PW();
      const int64_t nk = p0 + t + 1;
      std::vector<double> o(size_t(Hq) * hd), s(nk);
      for (int hq = 0; hq < Hq; ++hq) {
        const auto& Kh = K[hq / G];
        const auto& Vh = V[hq / G];
        const auto q = normrope(pr + hq * 2 * hd, qn, p0 + t);
        double mx = -1e300;
        for (int64_t j = 0; j < nk; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += q[d] * Kh[size_t(j) * hd + d];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        for (auto& x : s) { x = std::exp(x - mx); l += x; }
        for (int d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < nk; ++j) acc += s[j] * Vh[size_t(j) * hd + d];
          const double gt = pr[hq * 2 * hd + hd + d];
          o[size_t(hq) * hd + d] = acc / l / (1 + std::exp(-gt));
        }
      }
      out.push_back(std::move(o));
    }
    return out;
  }
};

// All tokens when T is small; else the first and last `edge` tokens and every `stride`-th one.
std::vector<int> pick_rows(int T, int edge, int stride) {
  std::vector<int> r;
  for (int t = 0; t < T; ++t)
    if (T <= 2 * edge || t < edge || t >= T - edge || t % stride == 0) r.push_back(t);
  return r;
}

// Compares the device output on the picked rows: whole-set and worst (token, head) row relative errors.
void expect_close(const PrefillCase& c, const std::vector<float>& got, const std::vector<int>& rows, const std::string& what) {
  const auto ref = c.reference(rows);
  const int hd = c.sh.hd, Hq = c.sh.Hq;
  std::vector<float> g_all;
  std::vector<double> r_all;
  double worst = 0;
  int worst_t = -1, worst_h = -1;
  for (size_t j = 0; j < rows.size(); ++j)
    for (int hq = 0; hq < Hq; ++hq) {
      const size_t base = (size_t(rows[j]) * Hq + hq) * hd;
      std::vector<float> g(got.begin() + base, got.begin() + base + hd);
      std::vector<double> r(ref[j].begin() + size_t(hq) * hd, ref[j].begin() + size_t(hq + 1) * hd);
      const double e = rel_err(g, r);
      if (!(e <= worst)) { worst = e; worst_t = rows[j]; worst_h = hq; }
      g_all.insert(g_all.end(), g.begin(), g.end());
      r_all.insert(r_all.end(), r.begin(), r.end());
    }
  const double all = rel_err(g_all, r_all);
  const std::string id = what + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(c.sh.Hkv) +
                         " hd=" + std::to_string(hd) + " T=" + std::to_string(c.T) + " pos=" + std::to_string(c.p0);
  EXPECT_LT(all, 4e-3) << id;
  EXPECT_LT(worst, 1.2e-2) << id << " worst row: token " << worst_t << " head " << worst_h;
}

const Shape kShapes[] = {
    {2, 2, 64, 16},  {4, 2, 64, 32},   {8, 1, 64, 16},  {4, 2, 128, 32},
    {16, 2, 128, 64}, {1, 1, 256, 64}, {4, 2, 256, 64}, {16, 2, 256, 64},
};

TEST(CudaAttnPrefill, MatchesReference) {
  LILY_REQUIRE_GPU();
  lily::cuda::init_kernels();  // dynamic shared-memory limits (hd 128/256 tiles need > 48 KB)
  std::mt19937 rng(61);
  const int Ts[] = {9, 16, 17, 63, 64, 65, 129};
  const int64_t P0[] = {0, 1, 100, 3000};
  int k = 0;
  for (const Shape& sh : kShapes)
    for (int T : Ts) {
      const int64_t p0 = P0[(k + k / 7) % 4];
      // attn_splits' choice, one split, and a forced odd split (partials + combine, empty splits)
      const int ns = k % 3 == 0 ? 0 : k % 3 == 1 ? 1 : 5;
      ++k;
      PrefillCase c(sh, p0, T, rng);
      expect_close(c, c.run(ns, false), pick_rows(T, 24, 5), "splits=" + std::to_string(ns));
    }
}

TEST(CudaAttnPrefill, LongPromptMatchesReference) {
  LILY_REQUIRE_GPU();
  lily::cuda::init_kernels();  // dynamic shared-memory limits (hd 128/256 tiles need > 48 KB)
  std::mt19937 rng(62);
  struct L { Shape sh; int64_t p0; int T; int ns; };
  const L cases[] = {
      {{16, 2, 256, 64}, 0, 2048, 0}, {{16, 2, 256, 64}, 3000, 2048, 0}, {{16, 2, 256, 64}, 100, 2048, 7},
      {{8, 1, 64, 16}, 1, 2048, 0},   {{4, 2, 128, 32}, 3000, 2048, 0},
  };
  for (const L& l : cases) {
    PrefillCase c(l.sh, l.p0, l.T, rng);
    const auto got = c.run(l.ns, false);
    expect_close(c, got, pick_rows(l.T, 12, 131), "splits=" + std::to_string(l.ns));
    // every row against the SIMT fp32 kernel (same bf16 cache, fp32 q and p)
    const auto simt = c.run(l.ns, true);
    std::vector<double> sd(simt.begin(), simt.end());
    EXPECT_LT(rel_err(got, sd), 4e-3) << "vs SIMT: hd=" << l.sh.hd << " pos=" << l.p0 << " T=" << l.T;
  }
}

// Timing of the 35B-A3B attention layer shape (Hq 16, Hkv 2, head_dim 256, rot 64).
TEST(CudaAttnPrefillBench, Shape35B) {
  LILY_REQUIRE_GPU();
  lily::cuda::init_kernels();  // dynamic shared-memory limits (hd 128/256 tiles need > 48 KB)
  if (!std::getenv("LILY_CUDA_BENCH")) GTEST_SKIP() << "set LILY_CUDA_BENCH=1 to run";
  const Shape sh{16, 2, 256, 64};
  struct B { int64_t p0; int T; bool simt; };
  const B runs[] = {{0, 2048, false}, {2048, 2048, false}, {0, 4096, false}, {0, 16384, false},
                    {0, 512, false},  {0, 2048, true}};
  std::mt19937 rng(63);
  std::printf("attn prefill, Hq 16 Hkv 2 hd 256:   pos     T  splits  kernel       ms   TFLOP/s\n");
  for (const B& b : runs) {
    const int64_t cap = b.p0 + b.T;
    const int PW = sh.Hq * 2 * sh.hd + 2 * sh.Hkv * sh.hd;
    Dev<float> dqn(std::vector<float>(sh.hd, 1.f)), dkn(std::vector<float>(sh.hd, 1.f));
    Dev<float> dp(randn(size_t(b.T) * PW, rng, 1.f)), dout(size_t(b.T) * sh.Hq * sh.hd);
    Dev<uint16_t> kc(randn_bf16(size_t(sh.Hkv) * cap * sh.hd, rng, 1.f).first);
    Dev<uint16_t> vc(randn_bf16(size_t(sh.Hkv) * cap * sh.hd, rng, 1.f).first);
    Dev<int64_t> pos(std::vector<int64_t>{b.p0});
    lily::cuda::AttnDev a;
    a.Hq = sh.Hq; a.Hkv = sh.Hkv; a.hd = sh.hd; a.rot = sh.rot; a.theta = 1e7f; a.q_norm = dqn.p; a.k_norm = dkn.p;
    const int ns = lily::cuda::attn_splits(a, b.T, cap);
    Dev<char> scratch(lily::cuda::attn_scratch_bytes(a, b.T, ns));
    lily::cuda::set_attn_prefill_simt(b.simt);
    auto once = [&] { lily::cuda::attn_core(a, dp.p, b.T, pos.p, kc.p, vc.p, cap, ns, dout.p, scratch.p, nullptr); };
    once();
    once();
    cudaEvent_t e0, e1;
    LILY_CU(cudaEventCreate(&e0));
    LILY_CU(cudaEventCreate(&e1));
    const int reps = b.simt ? 3 : 10;
    LILY_CU(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) once();
    LILY_CU(cudaEventRecord(e1));
    LILY_CU(cudaEventSynchronize(e1));
    float ms = 0;
    LILY_CU(cudaEventElapsedTime(&ms, e0, e1));
    ms /= reps;
    lily::cuda::set_attn_prefill_simt(false);
    LILY_CU(cudaEventDestroy(e0));
    LILY_CU(cudaEventDestroy(e1));
    // causal: row t sees p0 + t + 1 keys; 2 FLOP per multiply-add, q·k and p·v
    double keys = 0;
    for (int t = 0; t < b.T; ++t) keys += double(b.p0 + t + 1);
    const double flop = 4.0 * keys * sh.hd * sh.Hq;
    std::printf("attn prefill  %34lld %5d %7d  %-6s %8.3f %9.1f\n", static_cast<long long>(b.p0), b.T, ns,
                b.simt ? "simt" : "tc", ms, flop / (ms * 1e-3) / 1e12);
    const auto out = dout.down();
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
  }
}

}  // namespace
#endif
