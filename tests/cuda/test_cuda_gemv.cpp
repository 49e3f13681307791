// The decode GEMV (gemv.cu) against a double-precision reference over shapes that reach every launch
// shape: rows per warp 1/2/4, lanes per row 8/16/32, the reduction split over 1..8 warps, SwiGLU
// pairs, fused RMSNorm, accumulate, expert slots — for bf16 and affine 4/8-bit weights.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaGemv, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/switches.h"
#include "cuda_test_util.h"
#include "quant/affine/affine.h"

namespace {
using lily::cudatest::Dev;
using lily::cudatest::randn;
using lily::cudatest::rel_err;
using lily::cuda::Mat;

struct GemvWeights {
  std::vector<float> deq;  // [E, out, in] as the kernel sees them
  std::unique_ptr<Dev<uint16_t>> w, s, b;
  std::unique_ptr<Dev<uint32_t>> q;
  Mat m;
};

// bits 0: bf16; else MLX affine with group gs.
GemvWeights make(int bits, int gs, int E, int out, int in, std::mt19937& rng) {
  GemvWeights W;
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

// x RMS-normalised (eps 1e-6) times w, as the fused GEMVs stage it; x itself when !norm.
std::vector<float> rms_normed(std::vector<float> x, const std::vector<float>& w, bool norm) {
  if (!norm) return x;
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1 / std::sqrt(ss / double(x.size()) + 1e-6);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(x[i] * inv * w[i]);
  return x;
}

double dot(const float* w, const float* x, int in) {
  double s = 0;
  for (int i = 0; i < in; ++i) s += double(w[i]) * x[i];
  return s;
}

// Σ |w_i · x_i|: the scale of a dot product's rounding error whatever its cancellation
double dot_abs(const float* w, const float* x, int in) {
  double s = 0;
  for (int i = 0; i < in; ++i) s += std::fabs(double(w[i]) * x[i]);
  return s;
}

void run_gemv_case(int bits, int gs, int out, int in, int slots, bool swiglu, bool norm, bool acc, std::mt19937& rng) {
  const int E = 3;
  const int rows = swiglu ? 2 * out : out;  // swiglu: out = I, W holds 2I rows
  GemvWeights W = make(bits, gs, E, rows, in, rng);
  std::vector<int32_t> ex(static_cast<size_t>(slots));
  for (int s = 0; s < slots; ++s) ex[size_t(s)] = (s * 2 + 1) % E;
  auto x = randn(size_t(slots) * in, rng);
  auto nw = randn(size_t(in), rng, 0.5f);
  for (auto& v : nw) v += 1.f;
  auto y0 = randn(size_t(slots) * out, rng);
  std::vector<double> ref(size_t(slots) * out), mag(size_t(slots) * out);
  for (int s = 0; s < slots; ++s) {
    const std::vector<float> xs = rms_normed({x.begin() + long(s) * in, x.begin() + long(s + 1) * in}, nw, norm);
    const float* we = W.deq.data() + size_t(ex[size_t(s)]) * rows * in;
    for (int o = 0; o < out; ++o) {
      double v = dot(we + size_t(o) * in, xs.data(), in), m = dot_abs(we + size_t(o) * in, xs.data(), in);
      if (swiglu) {  // first-order error of silu(g) · u: |silu'(g)| ≤ 1.1
        const double u = dot(we + size_t(o + out) * in, xs.data(), in), g = v / (1 + std::exp(-v));
        m = 1.1 * m * std::fabs(u) + std::fabs(g) * dot_abs(we + size_t(o + out) * in, xs.data(), in);
        v = g * u;
      }
      ref[size_t(s) * out + o] = v + (acc ? y0[size_t(s) * out + o] : 0.0);
      mag[size_t(s) * out + o] = m + (acc ? std::fabs(y0[size_t(s) * out + o]) : 0.0);
    }
  }
  Dev<float> dx(x), dnw(nw), dy(y0);
  Dev<int32_t> dex(ex);
  if (!acc) dy.poison();
  lily::cuda::gemv_slots(W.m, dex.p, swiglu ? 0 : out, in, dx.p, in, 1, slots, dy.p, out, acc, swiglu ? out : 0, nullptr,
                         norm ? dnw.p : nullptr, 1e-6f);
  const auto g = lily::cuda::gemv_shape(bits, in, out, slots, 132, swiglu);
  const std::vector<float> got = dy.down();
  // each output within 1e-5 of its Σ|w·x| (a few outputs can cancel to near zero), and the whole vector's
  // relative error where there are enough outputs for the norm to be stable
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]) / std::max(mag[i], 1e-30));
  EXPECT_LT(worst, 1e-5) << "bits " << bits << " gs " << gs << " " << out << "x" << in << " slots " << slots;
  if (ref.size() >= 16) {
    EXPECT_LT(rel_err(got, ref), 2e-5) << "bits " << bits << " gs " << gs << " " << out << "x" << in << " slots " << slots
                                           << (swiglu ? " swiglu" : "") << (norm ? " norm" : "") << (acc ? " acc" : "")
                                           << " (rpw " << g.rpw << " lpr " << g.lpr << " ks " << g.ks << ")";
  }
}

TEST(CudaGemv, EveryLaunchShapeMatchesReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(11);
  // the streaming kernel for every shape (the ring has its own tests)
  const lily::cuda::KernelSwitches saved = lily::cuda::kernel_switches();
  lily::cuda::KernelSwitches sw = saved;
  sw.gemv_ring = false;
  lily::cuda::set_kernel_switches(sw);
  struct Restore {
    lily::cuda::KernelSwitches s;
    ~Restore() { lily::cuda::set_kernel_switches(s); }
  } restore{saved};
  // (out, in): many rows (rpw 4), few rows with long inputs (split reduction), short rows (lpr 8/16)
  const std::pair<int, int> shapes[] = {{1, 2048}, {3, 512}, {17, 4096}, {64, 256}, {65, 128}, {129, 1024},
                                        {257, 2048}, {1031, 512}, {4099, 2048}, {20000, 2048}, {16896, 512}};
  for (int bits : {0, 4, 8})
    for (auto [out, in] : shapes) {
      const int gs = in % 128 == 0 && out % 2 ? 128 : in % 64 == 0 ? 64 : 32;
      run_gemv_case(bits, gs, out, in, 1, false, false, false, rng);
      run_gemv_case(bits, gs, out, in, 2, false, true, true, rng);
      if (out <= 1031) run_gemv_case(bits, 32, out, in, 9, true, out % 2 == 1, false, rng);
    }
  for (int bits : {0, 4}) run_gemv_case(bits, 64, 8448, 512, 1, true, true, false, rng);  // SwiGLU, 2 row pairs per warp
  // many slots (the experts of a 16- or 32-row step): several blocks per slot
  for (int bits : {0, 4})
    for (int slots : {72, 144, 288}) {
      run_gemv_case(bits, 64, 512, 2048, slots, true, false, false, rng);
      run_gemv_case(bits, 64, 2048, 512, slots, false, false, true, rng);
    }
}

// The 4-bit streaming GEMV with codes dequantised in place into floats of exponent 2^23
// (KernelSwitches::gemv_mantissa): the launch shapes of the test above (8192 inputs: the staging without 16-byte
// loads), and the experts of 2-, 4- and 8-token steps.
TEST(CudaGemv, MantissaDequantMatchesReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(17);
  lily::cudatest::SwitchesScope mant([](lily::cuda::KernelSwitches& k) {
    k.gemv_ring = false;
    k.gemv_mantissa = true;
  });
  const std::pair<int, int> shapes[] = {{1, 2048}, {3, 512}, {17, 4096}, {64, 256}, {65, 128}, {129, 1024}, {4099, 2048},
                                        {16896, 512}, {33, 8192}};
  for (auto [out, in] : shapes) {
    const int gs = in % 128 == 0 && out % 2 ? 128 : in % 64 == 0 ? 64 : 32;
    run_gemv_case(4, gs, out, in, 1, false, false, false, rng);
    run_gemv_case(4, gs, out, in, 2, false, true, true, rng);
    if (out <= 1031) run_gemv_case(4, 32, out, in, 9, true, out % 2 == 1, false, rng);
  }
  for (int slots : {18, 36, 72}) {
    run_gemv_case(4, 64, 512, 2048, slots, true, true, false, rng);
    run_gemv_case(4, 64, 2048, 512, slots, false, false, true, rng);
  }
}

bool sm90() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major >= 9;
}

// The ring GEMV (gemv_ring.cu), called directly: plain rows (1-4 input rows, fused RMSNorm, accumulate),
// SwiGLU expert slots over 1-4 input rows, and the MoE down projection with the weighted sum over slots (CONCAT).
// Each returns whether the ring took the product (it declines shapes whose tiles do not fit its stages or
// whose scale rows are not whole 16-byte units); numbers are checked whenever it did. Several input rows give
// each row exactly what that row alone gives (same sums in the same order).
bool ring_plain(int bits, int gs, int out, int in, bool norm, bool acc, std::mt19937& rng, int rows = 1) {
  GemvWeights W = make(bits, gs, 1, out, in, rng);
  auto x = randn(size_t(rows) * in, rng), nw = randn(size_t(in), rng, 0.5f), y0 = randn(size_t(rows) * out, rng);
  for (auto& v : nw) v += 1.f;
  std::vector<double> ref(size_t(rows) * out);
  for (int r = 0; r < rows; ++r) {
    const std::vector<float> xr(x.begin() + ptrdiff_t(r) * in, x.begin() + ptrdiff_t(r + 1) * in);
    const std::vector<float> xs = rms_normed(xr, nw, norm);
    for (int o = 0; o < out; ++o)
      ref[size_t(r) * out + o] = dot(W.deq.data() + size_t(o) * in, xs.data(), in) + (acc ? y0[size_t(r) * out + o] : 0.0);
  }
  Dev<float> dx(x), dnw(nw), dy(y0);
  if (!acc) dy.poison();
  // covered whenever a row's scales are whole 16-byte units (every bulk copy is); others may decline
  const bool took = lily::cuda::gemv_ring(W.m, nullptr, out, in, dx.p, in, 1, rows, dy.p, out, acc, 0, nullptr,
                                          norm ? dnw.p : nullptr, 1e-6f);
  if (!took) return false;
  const std::vector<float> got = dy.down();
  EXPECT_LT(rel_err(got, ref), 2e-5) << "ring bits " << bits << " gs " << gs << " " << out << "x" << in << " rows "
                                     << rows << (norm ? " norm" : "") << (acc ? " acc" : "");
  for (int r = 0; r < rows && rows > 1; ++r) {  // each row alone: the same bits
    Dev<float> y1(std::vector<float>(y0.begin() + ptrdiff_t(r) * out, y0.begin() + ptrdiff_t(r + 1) * out));
    EXPECT_TRUE(lily::cuda::gemv_ring(W.m, nullptr, out, in, dx.p + size_t(r) * in, in, 1, 1, y1.p, out, acc, 0,
                                      nullptr, norm ? dnw.p : nullptr, 1e-6f));
    const std::vector<float> one = y1.down();
    EXPECT_EQ(0, std::memcmp(one.data(), got.data() + size_t(r) * out, sizeof(float) * size_t(out)))
        << "row " << r << " of " << rows << " differs from the row alone, " << out << "x" << in;
  }
  return true;
}

// xdiv: slots per input row (slot s reads row s / xdiv)
bool ring_swiglu(int bits, int gs, int I, int in, int slots, bool norm, std::mt19937& rng, int xdiv = 0) {
  const int E = 5;
  if (xdiv <= 0) xdiv = slots;
  const int rows = (slots + xdiv - 1) / xdiv;
  GemvWeights W = make(bits, gs, E, 2 * I, in, rng);
  std::vector<int32_t> ex(static_cast<size_t>(slots));
  for (int s = 0; s < slots; ++s) ex[size_t(s)] = (s * 3 + 2) % E;
  auto x = randn(size_t(rows) * in, rng), nw = randn(size_t(in), rng, 0.5f);
  for (auto& v : nw) v += 1.f;
  std::vector<double> ref(size_t(slots) * I);
  for (int s = 0; s < slots; ++s) {
    const int r = s / xdiv;
    const std::vector<float> xr(x.begin() + ptrdiff_t(r) * in, x.begin() + ptrdiff_t(r + 1) * in);
    const std::vector<float> xs = rms_normed(xr, nw, norm);
    const float* we = W.deq.data() + size_t(ex[size_t(s)]) * 2 * I * in;
    for (int o = 0; o < I; ++o) {
      const double g = dot(we + size_t(o) * in, xs.data(), in), u = dot(we + size_t(o + I) * in, xs.data(), in);
      ref[size_t(s) * I + o] = g / (1 + std::exp(-g)) * u;
    }
  }
  Dev<float> dx(x), dnw(nw), dy(size_t(slots) * I);
  Dev<int32_t> dex(ex);
  dy.poison();
  const bool took = lily::cuda::gemv_ring(W.m, dex.p, 0, in, dx.p, in, xdiv, slots, dy.p, I, false, I, nullptr,
                                          norm ? dnw.p : nullptr, 1e-6f);
  if (!took) return false;
  EXPECT_LT(rel_err(dy.down(), ref), 2e-5) << "ring swiglu bits " << bits << " gs " << gs << " I " << I << " in " << in
                                           << " slots " << slots << " per row " << xdiv;
  return true;
}

// groups: tokens of the step, slots / groups consecutive slots each, output rows y + g·out
bool ring_concat(int bits, int gs, int out, int in, int slots, bool acc, std::mt19937& rng, int groups = 1) {
  const int E = 11, kk = slots / groups;
  GemvWeights W = make(bits, gs, E, out, in, rng);
  std::vector<int32_t> ex(static_cast<size_t>(slots));
  for (int s = 0; s < slots; ++s) ex[size_t(s)] = (s * 4 + 1) % E;
  auto h = randn(size_t(slots) * in, rng, 3.f), wt = randn(size_t(slots), rng), y0 = randn(size_t(groups) * out, rng);
  std::vector<double> ref(size_t(groups) * out);
  for (int g = 0; g < groups; ++g)
    for (int o = 0; o < out; ++o) {
      double v = acc ? y0[size_t(g) * out + o] : 0.0;
      for (int s = g * kk; s < (g + 1) * kk; ++s)
        v += wt[size_t(s)] * dot(W.deq.data() + (size_t(ex[size_t(s)]) * out + o) * in, h.data() + size_t(s) * in, in);
      ref[size_t(g) * out + o] = v;
    }
  Dev<float> dh(h), dw(wt), dy(y0);
  Dev<int32_t> dex(ex);
  if (!acc) dy.poison();
  const bool took =
      lily::cuda::gemv_ring_concat(W.m, dex.p, out, in, dh.p, in, dw.p, slots, groups, dy.p, out, acc, nullptr);
  if (!took) return false;
  const std::vector<float> got = dy.down();
  EXPECT_LT(rel_err(got, ref), 2e-5) << "ring concat bits " << bits << " gs " << gs << " " << out << "x" << in
                                     << " slots " << slots << " groups " << groups << (acc ? " acc" : "");
  for (int g = 0; g < groups && groups > 1; ++g) {  // each token alone: the same bits
    Dev<float> y1(std::vector<float>(y0.begin() + ptrdiff_t(g) * out, y0.begin() + ptrdiff_t(g + 1) * out));
    EXPECT_TRUE(lily::cuda::gemv_ring_concat(W.m, dex.p + g * kk, out, in, dh.p + size_t(g) * kk * in, in,
                                             dw.p + g * kk, kk, 1, y1.p, out, acc, nullptr));
    const std::vector<float> one = y1.down();
    EXPECT_EQ(0, std::memcmp(one.data(), got.data() + size_t(g) * out, sizeof(float) * size_t(out)))
        << "token " << g << " of " << groups << " differs from the token alone, " << out << "x" << in;
  }
  return true;
}

TEST(CudaGemv, RingMatchesReference) {
  LILY_REQUIRE_GPU();
  if (!sm90()) GTEST_SKIP() << "the ring GEMV needs sm_90";
  std::mt19937 rng(12);
  {  // the switch: steps of ring_rows_min..4 rows take several rows (default 2), 0 none
    GemvWeights W = make(4, 64, 1, 256, 512, rng);
    Dev<float> dx(randn(size_t(4) * 512, rng)), dy(size_t(4) * 256);
    auto takes = [&](int rows) {
      return lily::cuda::gemv_ring(W.m, nullptr, 256, 512, dx.p, 512, 1, rows, dy.p, 256, false, 0, nullptr, nullptr, 1e-6f);
    };
    lily::cudatest::SwitchesScope defaults([](lily::cuda::KernelSwitches& k) {
      k.ring_rows_min = lily::cuda::KernelSwitches{}.ring_rows_min;
      k.ring_moe_rows = lily::cuda::KernelSwitches{}.ring_moe_rows;
    });
    EXPECT_TRUE(takes(1));
    EXPECT_TRUE(takes(2));
    EXPECT_TRUE(takes(3));
    EXPECT_TRUE(takes(4));
    EXPECT_FALSE(takes(5));
    // the MoE kinds of several tokens are off by default (ring_moe_rows 1: a GEMV per slot measured faster)
    std::mt19937 rng_e(13);  // its own draws: the cases below keep theirs
    GemvWeights E = make(4, 64, 2, 64, 512, rng_e);
    Dev<int32_t> ids(std::vector<int32_t>{0, 1, 1, 0});
    Dev<float> dh(size_t(4) * 64);
    EXPECT_TRUE(lily::cuda::gemv_ring(E.m, ids.p, 0, 512, dx.p, 512, 2, 2, dh.p, 32, false, 32, nullptr, nullptr, 1e-6f))
        << "one token's expert slots take the ring";
    EXPECT_FALSE(lily::cuda::gemv_ring(E.m, ids.p, 0, 512, dx.p, 512, 1, 4, dh.p, 32, false, 32, nullptr, nullptr, 1e-6f))
        << "4 tokens' slots leave the ring by default";
    lily::cudatest::SwitchesScope three([](lily::cuda::KernelSwitches& k) { k.ring_rows_min = 3; });
    EXPECT_FALSE(takes(2)) << "ring_rows_min 3: 2 rows keep the per-row GEMVs";
    lily::cudatest::SwitchesScope off([](lily::cuda::KernelSwitches& k) { k.ring_rows_min = 0; });
    EXPECT_TRUE(takes(1));
    EXPECT_FALSE(takes(3));
  }
  lily::cudatest::SwitchesScope every_row_count([](lily::cuda::KernelSwitches& k) {
    k.ring_rows_min = 2;
    k.ring_moe_rows = 4;
  });
  const std::pair<int, int> shapes[] = {{1, 2048}, {2, 2048}, {3, 512}, {17, 4096}, {63, 2048}, {64, 2048}, {65, 2048},
                                        {65, 128}, {129, 1024}, {257, 2048}, {2048, 512}, {4099, 2048}, {20000, 2048},
                                        {2, 32}};
  for (int bits : {4, 8})
    for (auto [out, in] : shapes) {
      const int gs = in % 128 == 0 && out % 2 ? 128 : in % 64 == 0 ? 64 : 32;
      ring_plain(bits, gs, out, in, false, false, rng);
      ring_plain(bits, gs, out, in, true, true, rng);
      if (out <= 4099)
        for (int rows : {2, 3, 4}) ring_plain(bits, gs, out, in, rows == 2, rows != 3, rng, rows);
    }
  for (int bits : {4, 8}) {
    for (int I : {1, 16, 17, 64, 65}) ring_swiglu(bits, 64, I, 2048, 9, I % 2 == 1, rng);
    ring_swiglu(bits, 32, 33, 128, 1, true, rng);
    // steps of 2-4 rows: the slots of each row's experts
    for (int rows : {2, 3, 4}) {
      ring_swiglu(bits, 64, 17, 2048, 8 * rows, rows <= 2, rng, 8);
      ring_swiglu(bits, 64, 64, 1024, 3 * rows - 1, false, rng, 3);
    }
    for (int out : {1, 2, 17, 63, 64, 65, 129})
      for (int slots : {1, 9}) ring_concat(bits, 64, out, 512, slots, out % 2 == 0, rng);
    ring_concat(bits, 32, 100, 32, 3, true, rng);
    // steps of 2-4 tokens, several staging passes (more than 8192 staged elements)
    for (int groups : {2, 3, 4}) {
      ring_concat(bits, 64, 65, 512, 8 * groups, groups != 3, rng, groups);
      ring_concat(bits, 64, 129, 1024, 3 * groups, true, rng, groups);
    }
    // the decode products of Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B must take the ring
    for (int gs : {64, 128}) {
      EXPECT_TRUE(ring_plain(bits, gs, 12288, 2048, true, false, rng)) << "GDN input projection, bits " << bits;
      EXPECT_TRUE(ring_plain(bits, gs, 2048, 4096, false, true, rng)) << "output projection, bits " << bits;
      for (int rows : {2, 4}) {
        EXPECT_TRUE(ring_plain(bits, gs, 12288, 2048, rows == 2, false, rng, rows)) << "GDN input, rows " << rows;
        if (bits == 4 || rows == 2) {  // 8-bit rows of 4096: 4 staged rows leave room for one stage only
          EXPECT_TRUE(ring_plain(bits, gs, 2048, 4096, false, true, rng, rows)) << "output projection, rows " << rows;
        }
      }
      for (int rows : {2, 3})  // at most 32 slots: 3 rows of 8 + 1, 2 rows of 10 + 1
        EXPECT_TRUE(ring_swiglu(bits, gs, 512, 2048, (rows == 2 ? 11 : 9) * rows, rows == 2, rng, rows == 2 ? 11 : 9))
            << "expert gate/up, rows " << rows;
      EXPECT_TRUE(ring_swiglu(bits, gs, 512, 2048, 9, true, rng)) << "expert gate/up, bits " << bits;
      EXPECT_TRUE(ring_concat(bits, gs, 2048, 512, 9, true, rng)) << "expert down, 8 + 1 slots, bits " << bits;
      EXPECT_TRUE(ring_concat(bits, gs, 2048, 512, 11, true, rng)) << "expert down, 10 + 1 slots, bits " << bits;
      for (int groups : {2, 3})
        EXPECT_TRUE(ring_concat(bits, gs, 2048, 512, 9 * groups, true, rng, groups)) << "expert down, tokens " << groups;
      EXPECT_TRUE(ring_concat(bits, gs, 2048, 512, 22, true, rng, 2)) << "expert down, 10 + 1 slots, 2 tokens";
    }
  }
}

TEST(CudaGemv, RingPlansCoverTheModelProducts) {
  // Host-side plan only (no device work): every decode product of Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B
  // takes the ring, with whole tiles covering the rows, and its stages fit two blocks per SM.
  using lily::cuda::gemv_ring_plan;
  struct P { int kind, in, rows, slots; const char* what; };
  const P products[] = {{0, 2048, 12288, 1, "GDN input projection"}, {0, 2048, 9216, 1, "attention q|gate|k|v"},
                        {0, 4096, 2048, 1, "output projections"},   {0, 2048, 248320, 1, "lm head"},
                        {1, 2048, 512, 9, "expert gate|up, 8 + 1 slots"}, {1, 2048, 512, 11, "expert gate|up, 10 + 1"},
                        {2, 512, 2048, 9, "expert down + combine, 8 + 1"}, {2, 512, 2048, 11, "expert down + combine, 10 + 1"}};
  for (int bits : {4, 8})
    for (int gs : {64, 128})
      for (const P& p : products) {
        const auto g = gemv_ring_plan(p.kind, bits, gs, p.in, p.rows, p.slots, 132);
        ASSERT_TRUE(g.covered) << p.what << " bits " << bits << " gs " << gs;
        EXPECT_GE(g.stages, 1);
        EXPECT_LE(g.smem, size_t(108 * 1024));
        const int64_t units = p.kind == 1 ? int64_t(p.slots) * ((p.rows + g.rows_per_tile - 1) / g.rows_per_tile)
                                          : (p.rows + g.rows_per_tile - 1) / g.rows_per_tile;
        EXPECT_EQ(g.tiles, units) << p.what;
        EXPECT_EQ(g.blocks, std::min<int64_t>(g.tiles, 2 * 132)) << p.what;
        if (bits == 4 && p.kind == 0 && p.in == 2048) {
          EXPECT_GE(g.stages, 3) << p.what;  // loads stay ahead of the warps
        }
      }
  // declined: inputs not a multiple of 128, too many slots, 3-bit codes, a partial last tile whose scale rows
  // are not whole 16-byte units (512 inputs in groups of 128: 8 bytes per row)
  EXPECT_FALSE(gemv_ring_plan(0, 4, 32, 96, 100, 1, 132).covered);
  EXPECT_FALSE(gemv_ring_plan(2, 4, 64, 512, 2048, 33, 132).covered);
  EXPECT_FALSE(gemv_ring_plan(0, 3, 64, 2048, 100, 1, 132).covered);
  EXPECT_FALSE(gemv_ring_plan(0, 4, 128, 512, 17, 1, 132).covered);
  EXPECT_TRUE(gemv_ring_plan(0, 4, 128, 512, 16, 1, 132).covered);
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
  for (int n : {72, 144, 288}) {  // many slots: every SM's two block slots busy in most rounds
    const auto many = gemv_shape(4, 2048, 512, n, 132, true);
    EXPECT_GT(many.blocks, 1) << n << " slots";
    EXPECT_GE(int64_t(many.blocks) * n, 264) << n << " slots";
  }
}

}  // namespace
#endif
