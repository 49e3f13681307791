// Each CUDA operation against a plain double-precision CPU reference, at awkward sizes: dense and affine
// products, RMSNorm, embedding rows, argmax (MoE: test_cuda_moe.cpp; DeltaNet: test_cuda_gdn.cpp; attention:
// test_cuda_attn.cpp).
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(Cuda, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>

#include "ops_cases.h"
#include "quant/affine/affine.h"

namespace {
using lily::cudatest::GemvRowsScope;
using lily::cudatest::moe_cases;
using lily::cudatest::Dev;
using lily::cudatest::HighPrecisionScope;
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

// The same products with every row count up to 64 on the GEMV paths (--cuda-opt gemv_rows / moe_gemv_rows).
TEST(CudaOps, ManyRowGemvsMatchReference) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // fp32-class tolerances (the bf16 mode: test_cuda_gemm.cpp)
  GemvRowsScope scope(64, 64);
  linear_cases();
  affine_linear_cases();
  moe_cases();
}

}  // namespace
#endif
