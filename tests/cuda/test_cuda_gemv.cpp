// The decode GEMV (gemv.cu) against a double-precision reference over shapes that reach every launch
// shape: rows per warp 1/2/4, lanes per row 8/16/32, the reduction split over 1..8 warps, SwiGLU
// pairs, fused RMSNorm, accumulate, expert slots — for bf16 and affine 4/8-bit weights.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaGemv, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <cmath>

#include "cuda_test_util.h"
#include "quant/affine/affine.h"

namespace {
using lily::cudatest::Dev;
using lily::cudatest::randn;
using lily::cudatest::rel_err;
using lily::cuda::Mat;

struct Weights {
  std::vector<float> deq;  // [E, out, in] as the kernel sees them
  std::unique_ptr<Dev<uint16_t>> w, s, b;
  std::unique_ptr<Dev<uint32_t>> q;
  Mat m;
};

// bits 0: bf16; else MLX affine with group gs.
Weights make(int bits, int gs, int E, int out, int in, std::mt19937& rng) {
  Weights W;
  auto f = randn(size_t(E) * out * in, rng, 1.f / std::sqrt(float(in)));
  if (bits == 0) {
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      h[i] = lily::f32_to_bf16(f[i]);
      f[i] = lily::bf16_to_f32(h[i]);
    }
    W.deq = f;
    W.w = std::make_unique<Dev<uint16_t>>(h);
    W.m = Mat::bf16(W.w->p, in, int64_t(out) * in);
    return W;
  }
  auto qz = lily::quant::affine_quantize(f.data(), int64_t(E) * out, in, bits, gs);
  auto view = qz.view();
  W.deq.resize(f.size());
  for (int64_t r = 0; r < int64_t(E) * out; ++r) lily::quant::affine_dequant_row_ref(view, r, W.deq.data() + size_t(r) * in);
  W.q = std::make_unique<Dev<uint32_t>>(qz.packed);
  W.s = std::make_unique<Dev<uint16_t>>(qz.scales);
  W.b = std::make_unique<Dev<uint16_t>>(qz.biases);
  Mat& m = W.m;
  m.affine = true; m.q = W.q->p; m.s = W.s->p; m.b = W.b->p; m.bits = bits; m.gs = gs;
  m.row_words = int64_t(in) * bits / 32;
  m.qstride = int64_t(out) * m.row_words; m.sstride = int64_t(out) * (in / gs);
  return W;
}

double dot(const float* w, const float* x, int in) {
  double s = 0;
  for (int i = 0; i < in; ++i) s += double(w[i]) * x[i];
  return s;
}

void run_case(int bits, int gs, int out, int in, int slots, bool swiglu, bool norm, bool acc, std::mt19937& rng) {
  const int E = 3;
  const int rows = swiglu ? 2 * out : out;  // swiglu: out = I, W holds 2I rows
  Weights W = make(bits, gs, E, rows, in, rng);
  std::vector<int32_t> ex(static_cast<size_t>(slots));
  for (int s = 0; s < slots; ++s) ex[size_t(s)] = (s * 2 + 1) % E;
  auto x = randn(size_t(slots) * in, rng);
  auto nw = randn(size_t(in), rng, 0.5f);
  for (auto& v : nw) v += 1.f;
  auto y0 = randn(size_t(slots) * out, rng);
  std::vector<double> ref(size_t(slots) * out);
  for (int s = 0; s < slots; ++s) {
    std::vector<float> xs(x.begin() + long(s) * in, x.begin() + long(s + 1) * in);
    if (norm) {
      double ss = 0;
      for (float v : xs) ss += double(v) * v;
      const double inv = 1 / std::sqrt(ss / in + 1e-6);
      for (int i = 0; i < in; ++i) xs[size_t(i)] = float(xs[size_t(i)] * inv * nw[size_t(i)]);
    }
    const float* we = W.deq.data() + size_t(ex[size_t(s)]) * rows * in;
    for (int o = 0; o < out; ++o) {
      double v = dot(we + size_t(o) * in, xs.data(), in);
      if (swiglu) v = v / (1 + std::exp(-v)) * dot(we + size_t(o + out) * in, xs.data(), in);
      ref[size_t(s) * out + o] = v + (acc ? y0[size_t(s) * out + o] : 0.0);
    }
  }
  Dev<float> dx(x), dnw(nw), dy(y0);
  Dev<int32_t> dex(ex);
  if (!acc) dy.poison();
  lily::cuda::gemv_slots(W.m, dex.p, swiglu ? 0 : out, in, dx.p, in, 1, slots, dy.p, out, acc, swiglu ? out : 0, nullptr,
                         norm ? dnw.p : nullptr, 1e-6f);
  const auto g = lily::cuda::gemv_shape(bits, in, out, slots, 132, swiglu);
  EXPECT_LT(rel_err(dy.down(), ref), 2e-5) << "bits " << bits << " gs " << gs << " " << out << "x" << in << " slots " << slots
                                           << (swiglu ? " swiglu" : "") << (norm ? " norm" : "") << (acc ? " acc" : "")
                                           << " (rpw " << g.rpw << " lpr " << g.lpr << " ks " << g.ks << ")";
}

TEST(CudaGemv, EveryLaunchShapeMatchesReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(11);
  // (out, in): many rows (rpw 4), few rows with long inputs (split reduction), short rows (lpr 8/16)
  const std::pair<int, int> shapes[] = {{1, 2048}, {3, 512}, {17, 4096}, {64, 256}, {65, 128}, {129, 1024},
                                        {257, 2048}, {1031, 512}, {4099, 2048}, {20000, 2048}, {16896, 512}};
  for (int bits : {0, 4, 8})
    for (auto [out, in] : shapes) {
      const int gs = in % 128 == 0 && out % 2 ? 128 : in % 64 == 0 ? 64 : 32;
      run_case(bits, gs, out, in, 1, false, false, false, rng);
      run_case(bits, gs, out, in, 2, false, true, true, rng);
      if (out <= 1031) run_case(bits, 32, out, in, 9, true, out % 2 == 1, false, rng);
    }
  for (int bits : {0, 4}) run_case(bits, 64, 8448, 512, 1, true, true, false, rng);  // SwiGLU, 2 row pairs per warp
}

TEST(CudaGemv, LaunchShapesCoverTheBranches) {
  // Host-side shape choice only (no device work): the cases above must reach each branch.
  using lily::cuda::gemv_shape;
  EXPECT_EQ(gemv_shape(4, 512, 16896, 1, 132, false).rpw, 4);
  EXPECT_EQ(gemv_shape(4, 512, 8448, 1, 132, true).rpw, 2);
  EXPECT_EQ(gemv_shape(4, 128, 65, 1, 132, false).lpr, 8);
  EXPECT_EQ(gemv_shape(4, 512, 1031, 1, 132, false).lpr, 16);
  EXPECT_GT(gemv_shape(0, 4096, 17, 1, 132, false).ks, 1);
  const auto strided = gemv_shape(4, 2048, 20000, 1, 132, false);  // blocks walk several tiles
  EXPECT_LT(strided.blocks, strided.tiles);
  const auto slots = gemv_shape(4, 2048, 1031, 9, 132, true);
  EXPECT_LT(slots.blocks, slots.tiles);
}

}  // namespace
#endif
