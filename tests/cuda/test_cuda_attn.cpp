// Gated attention on CUDA (q/k norm, RoPE, KV append, prompt and decode steps) against a double-precision
// CPU reference.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaAttn, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>

#include "cuda_test_util.h"

namespace {
using lily::cudatest::Dev;
using lily::cudatest::randn;
using lily::cudatest::randn_bf16;
using lily::cudatest::rel_err;

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
// G·T <= 8 or token blocks, follow), and rows past the live keys hold NaN, so reading one shows up.
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
    // the decode kernel's precision: G·T <= 8 packed rows, or token blocks of a few-row step (attn_token_blocks)
    const bool dec = (Hq / Hkv) * T <= 8 || (lily::cuda::kernel_switches().attn_token_blocks && T <= lily::cuda::kAttnTokenBlocksMax);
    if (p0 > 0) {
      ASSERT_TRUE(dec) << "decode steps only after the directly written keys";
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
    const double tol = dec ? 1e-4 : 4e-3;
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

// Steps of 2-4 rows (kAttnTokenBlocksMax) of one sequence beyond the decode kernel's 8 packed rows on that
// kernel, a z-block per 8 / G tokens (KernelSwitches::attn_token_blocks): G 8 (a block per token), G 4 (2 tokens,
// the last block short at odd T), G 2 (4 tokens); after a prompt, at 4K keys, with split counts 1 and 7 and the
// chosen one; steps of 5-8 rows between them take the prompt kernel.
TEST(CudaOps, AttentionTokenBlocksMatchReference) {
  LILY_REQUIRE_GPU();
  lily::cudatest::SwitchesScope on([](lily::cuda::KernelSwitches& k) { k.attn_token_blocks = true; });
  std::mt19937 rng(8);
  for (int split : {0, 1, 7}) {
    run_attn_case(16, 2, 256, 64, {600, 4, 1, 3, 8, 2}, split, rng);
    run_attn_case(8, 2, 64, 32, {40, 3, 5, 8, 2, 7}, split, rng);
    run_attn_case(4, 2, 128, 32, {33, 5, 7, 8, 3}, split, rng);
    run_attn_case(16, 2, 256, 64, {4, 3, 2}, split, rng, 4095);
  }
  run_attn_case(16, 2, 256, 64, {4, 3}, 0, rng, 30000);
}

}  // namespace
#endif
