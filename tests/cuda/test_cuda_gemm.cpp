// Tensor-core GEMMs (gemm_tc, and the Hopper gemm_wgmma) against a double-precision CPU reference: dense rows and gathered expert tile
// maps, bf16 and MLX affine 4/8-bit weights (groups 32/64/128), every precision (split, bf16, fp16), = and +=;
// the fp16 mode's row scales on rows of every magnitude (zero, tiny, beyond fp16's range, inf, NaN).
// Error bound per output: c · Σ_i |x_i|·|w_i| (the row's own scale), c from the rounding of each mode.
// CudaGemmBench.RealShapes (LILY_CUDA_BENCH=1) prints TFLOP/s on the Qwen3.5-35B-A3B prompt shapes (the
// kernels side by side: `lily bench --gemm --backend cuda`).
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaGemm, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/gemm_wgmma.h"
#include "backend/cuda/gemm_wgmma_rs.h"
#include "cuda_test_util.h"
#include "quant/affine/affine.h"

namespace {
using lily::cuda::GemmPrec;
using lily::cuda::Mat;
using lily::cudatest::Dev;
using lily::cudatest::randn;
using lily::cudatest::randn_bf16;
using lily::cudatest::rel_err;
using lily::cudatest::SwitchesScope;

// E stacked [out, in] matrices on the device and their exact float values (dequantised for affine).
struct GemmWeights {
  int bits = 0, gs = 0, E = 0, out = 0, in = 0;
  std::vector<float> f;  // [E, out, in]
  std::unique_ptr<Dev<uint16_t>> w, s, b;
  std::unique_ptr<Dev<uint32_t>> q;
  Mat m;
  std::string name() const {
    return bits ? "affine" + std::to_string(bits) + "-g" + std::to_string(gs) : std::string("bf16");
  }
};

GemmWeights make_gemm_weights(int bits, int gs, int E, int out, int in, std::mt19937& rng) {
  GemmWeights W;
  W.bits = bits; W.gs = gs; W.E = E; W.out = out; W.in = in;
  const size_t n = size_t(E) * out * in;
  if (bits == 0) {
    auto [b, f] = randn_bf16(n, rng, 1.f / std::sqrt(float(in)));
    W.f = f;
    W.w = std::make_unique<Dev<uint16_t>>(b);
    W.m = Mat::bf16(W.w->p, in, int64_t(out) * in);
    return W;
  }
  auto wf = randn(n, rng, 1.f / std::sqrt(float(in)));
  auto qz = lily::quant::affine_quantize(wf.data(), int64_t(E) * out, in, bits, gs);
  auto view = qz.view();
  W.f.resize(n);
  for (int64_t r = 0; r < int64_t(E) * out; ++r) lily::quant::affine_dequant_row_ref(view, r, W.f.data() + size_t(r) * in);
  W.q = std::make_unique<Dev<uint32_t>>(qz.packed);
  W.s = std::make_unique<Dev<uint16_t>>(qz.scales);
  W.b = std::make_unique<Dev<uint16_t>>(qz.biases);
  Mat& m = W.m;
  m.affine = true; m.q = W.q->p; m.s = W.s->p; m.b = W.b->p; m.bits = bits; m.gs = gs;
  m.row_words = int64_t(in) * bits / 32;
  m.qstride = int64_t(out) * m.row_words;
  m.sstride = int64_t(out) * (in / gs);
  return W;
}

// Output row r uses expert ex[r] and input row src[r] of x (ldx apart).
struct GemmRef {
  std::vector<double> y, scale;  // [rows, out]
};
GemmRef reference(const GemmWeights& W, const std::vector<float>& x, int64_t ldx, const std::vector<int>& ex,
              const std::vector<int>& src) {
  const size_t rows = ex.size();
  GemmRef R;
  R.y.resize(rows * W.out);
  R.scale.resize(rows * W.out);
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + size_t(src[r]) * ldx;
    for (int o = 0; o < W.out; ++o) {
      const float* w = W.f.data() + (size_t(ex[r]) * W.out + o) * W.in;
      double s = 0, a = 0;
      for (int i = 0; i < W.in; ++i) {
        s += double(w[i]) * xr[i];
        a += std::fabs(double(w[i]) * xr[i]);
      }
      R.y[r * W.out + o] = s;
      R.scale[r * W.out + o] = a;
    }
  }
  return R;
}

// |y - (y0 + ref)| <= c · scale per element (NaN fails), plus the norm-relative error of the whole output
// (>= 256 outputs).
void expect_close(const std::vector<float>& y, int64_t ldy, const GemmRef& R, const std::vector<float>* y0, int out,
                  GemmPrec prec, const std::string& what) {
  // bf16: x (and affine w) rounded to 8 bits; fp16: to 11 bits (x after its power-of-two scale)
  const double c = prec == GemmPrec::kBf16   ? 1.01 * std::ldexp(1.0, -8)
                   : prec == GemmPrec::kFp16 ? 1.01 * std::ldexp(1.0, -10)
                                             : std::ldexp(1.0, -15);
  const double rel_max = prec == GemmPrec::kBf16 ? 4e-3 : prec == GemmPrec::kFp16 ? 5e-4 : 2e-5;
  const size_t rows = R.y.size() / size_t(out);
  std::vector<float> got(R.y.size());
  std::vector<double> want(R.y.size());
  int bad = 0;
  double worst = 0;
  for (size_t r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      const size_t i = r * out + o, j = r * size_t(ldy) + o;
      want[i] = R.y[i] + (y0 ? (*y0)[j] : 0.0);
      got[i] = y[j];
      const double err = std::fabs(double(got[i]) - want[i]);
      const double lim = c * R.scale[i] + 1e-30;
      if (!(err <= lim)) ++bad;
      if (std::isfinite(err)) worst = std::max(worst, err / lim);
      else worst = INFINITY;
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " outputs past " << c << "·Σ|x||w| (worst " << worst << "x)";
  // the norm-relative error is a statistical measure: only over enough outputs (a handful can cancel to ~0)
  if (got.size() >= 256) {
    EXPECT_LT(rel_err(got, want), rel_max) << what;
  }
}

const char* prec_name(GemmPrec p) { return p == GemmPrec::kBf16 ? "bf16" : p == GemmPrec::kFp16 ? "fp16" : "split"; }
const GemmPrec kPrecs[] = {GemmPrec::kSplit, GemmPrec::kBf16, GemmPrec::kFp16};

struct Format {
  int bits, gs;
};
const Format kFormats[] = {{0, 0}, {4, 32}, {4, 64}, {4, 128}, {8, 32}, {8, 64}, {8, 128}};

TEST(CudaGemm, DenseMatchesReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(11);
  const std::pair<int, int> shapes[] = {{130, 256}, {7, 96}, {257, 128}, {1, 32}};
  for (auto [bits, gs] : kFormats)
    for (auto [out, in] : shapes) {
      if (bits && in % gs) continue;
      GemmWeights W = make_gemm_weights(bits, gs, 1, out, in, rng);
      std::vector<int> rows_list = {1, 2, 3, 16, 17, 33, 63, 64, 65, 129};
      if ((bits == 0 || (bits == 4 && gs == 64)) && out == 130) rows_list.push_back(2048);
      for (int T : rows_list) {
        const int64_t ldx = in + 8, ldy = out + 3;  // strided rows on both sides
        auto x = randn(size_t(T) * ldx, rng);
        std::vector<int> ex(T, 0), src(T);
        for (int t = 0; t < T; ++t) src[t] = t;
        const GemmRef R = reference(W, x, ldx, ex, src);
        Dev<float> dx(x), dy(size_t(T) * ldy);
        for (GemmPrec prec : kPrecs) {
          const std::string what = W.name() + " " + prec_name(prec) + " " + std::to_string(out) + "x" +
                                   std::to_string(in) + " T=" + std::to_string(T);
          dy.poison();
          ASSERT_TRUE(lily::cuda::gemm_tc(W.m, out, in, dx.p, ldx, nullptr, dy.p, ldy, false, nullptr, nullptr,
                                          (T + 63) / 64, T, prec, nullptr));
          auto y1 = dy.down();
          expect_close(y1, ldy, R, nullptr, out, prec, what);
          // accumulate onto arbitrary values
          auto y0 = randn(size_t(T) * ldy, rng);
          dy.up(y0);
          ASSERT_TRUE(lily::cuda::gemm_tc(W.m, out, in, dx.p, ldx, nullptr, dy.p, ldy, true, nullptr, nullptr,
                                          (T + 63) / 64, T, prec, nullptr));
          expect_close(dy.down(), ldy, R, &y0, out, prec, what + " +=");
        }
      }
    }
}

// Expert tile map as moe.cu's route_kernel builds it: experts in order, tiles of <= tile_rows rows (64, or the
// wgmma kernel's 128), rows of an expert contiguous; tiles past *n_tiles hold garbage that must not be read.
// Row r belongs to expert ex[r] and reads input row gather[r] of `tokens` (gathered) or r (plain).
struct TileMap {
  int E = 0, n = 0, live = 0, max_tiles = 0, tokens = 0;
  std::vector<int> ex, gather;
  std::unique_ptr<Dev<int32_t>> tiles, n_tiles, dgather;
};
TileMap make_tile_map(const std::vector<int>& counts, int tokens, std::mt19937& rng, int tile_rows = 64) {
  TileMap m;
  m.E = int(counts.size());
  m.tokens = tokens;
  std::vector<int> tiles;
  for (int e = 0, o = 0; e < m.E; ++e) {
    for (int r = 0; r < counts[e]; r += tile_rows)
      tiles.insert(tiles.end(), {e, o + r, std::min(tile_rows, counts[e] - r)});
    for (int r = 0; r < counts[e]; ++r) m.ex.push_back(e);
    o += counts[e];
  }
  m.n = int(m.ex.size());
  m.live = int(tiles.size() / 3);
  for (int g = 0; g < 3; ++g) tiles.insert(tiles.end(), {1 << 20, 1 << 28, 64});  // never read
  m.max_tiles = int(tiles.size() / 3);
  m.gather.resize(size_t(m.n));
  for (auto& v : m.gather) v = int(rng() % uint32_t(tokens));
  m.tiles = std::make_unique<Dev<int32_t>>(tiles);
  m.n_tiles = std::make_unique<Dev<int32_t>>(std::vector<int32_t>{m.live});
  m.dgather = std::make_unique<Dev<int32_t>>(m.gather);
  return m;
}

// Every weight format and shape (out, in) over the map, gathered and plain inputs: run(W, dx, gathered, R, what).
template <typename F>
void for_each_tile_case(const TileMap& m, const std::vector<std::pair<int, int>>& shapes, std::mt19937& rng, F&& run) {
  for (auto [bits, gs] : kFormats)
    for (auto [out, in] : shapes) {
      if (bits && in % gs) continue;
      GemmWeights W = make_gemm_weights(bits, gs, m.E, out, in, rng);
      for (bool gathered : {true, false}) {
        auto x = randn(size_t(gathered ? m.tokens : m.n) * in, rng);
        std::vector<int> src(static_cast<size_t>(m.n));
        for (int r = 0; r < m.n; ++r) src[size_t(r)] = gathered ? m.gather[size_t(r)] : r;
        const GemmRef R = reference(W, x, in, m.ex, src);
        Dev<float> dx(x);
        run(W, dx, gathered, R, W.name() + " tiles " + std::to_string(out) + "x" + std::to_string(in) + (gathered ? " gathered" : ""));
      }
    }
}

// product(accumulate) into dy: = (over poisoned outputs), then += onto random values; both against R.
template <typename F>
void check_both(F&& product, Dev<float>& dy, int out, const GemmRef& R, GemmPrec prec, const std::string& what,
                std::mt19937& rng) {
  dy.poison();
  ASSERT_TRUE(product(false));
  expect_close(dy.down(), out, R, nullptr, out, prec, what);
  auto y0 = randn(dy.n, rng);
  dy.up(y0);
  ASSERT_TRUE(product(true));
  expect_close(dy.down(), out, R, &y0, out, prec, what + " +=");
}

TEST(CudaGemm, ExpertTilesMatchReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(12);
  // experts with no rows, one tile, several tiles; partial tiles ending in each m16 tile of both row warps
  const TileMap m = make_tile_map({0, 1, 64, 0, 65, 200, 3, 16, 17, 32, 33, 47, 48, 49, 63}, 97, rng);
  for_each_tile_case(m, {{130, 256}, {64, 128}}, rng,
                     [&](const GemmWeights& W, const Dev<float>& dx, bool gathered, const GemmRef& R, const std::string& what) {
    const int out = W.out, in = W.in;
    Dev<float> dy(size_t(m.n) * out);
    for (GemmPrec prec : kPrecs)
      check_both([&](bool acc) {
        return lily::cuda::gemm_tc(W.m, out, in, dx.p, in, gathered ? m.dgather->p : nullptr, dy.p, out, acc, m.tiles->p,
                                   m.n_tiles->p, m.max_tiles, m.n, prec, nullptr);
      }, dy, out, R, prec, what + " " + prec_name(prec), rng);
  });
}

// The awkward sizes on the mma.sync kernel in every precision: experts with 0, 1, 15, 16, 17, 127, 128
// and 129 rows, K not a multiple of the 64-deep stage (96, 160, 544); gathered inputs with the x row count given
// (the fp16 mode then scales each x row once) and without it (once per product row).
TEST(CudaGemm, AwkwardExpertTilesEveryPrecision) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(14);
  const TileMap m = make_tile_map({0, 1, 15, 16, 17, 127, 128, 129, 0}, 113, rng);
  for_each_tile_case(m, {{130, 96}, {72, 544}, {200, 160}}, rng,
                     [&](const GemmWeights& W, const Dev<float>& dx, bool gathered, const GemmRef& R, const std::string& what) {
    const int out = W.out, in = W.in;
    Dev<float> dy(size_t(m.n) * out);
    for (GemmPrec prec : kPrecs)
      for (int x_rows : {0, gathered ? m.tokens : m.n}) {
        const std::string w = what + " " + prec_name(prec) + " x_rows=" + std::to_string(x_rows);
        dy.poison();
        ASSERT_TRUE(lily::cuda::gemm_tc(W.m, out, in, dx.p, in, gathered ? m.dgather->p : nullptr, dy.p, out, false,
                                        m.tiles->p, m.n_tiles->p, m.max_tiles, m.n, prec, nullptr, x_rows));
        expect_close(dy.down(), out, R, nullptr, out, prec, w);
      }
  });
}

// fp16 mode, rows of every magnitude: each input row scaled by 10^(r % 9 - 4) (1e3 more every fifth row: up to
// 1e7, far beyond fp16's 65,504; down to 1e-4), plus a row of zeros, rows of 1e30 and 1e-30, a row holding one NaN
// and one holding one inf. The finite rows stay within the fp16 bound of their own scale, zeros give zeros, NaN
// stays NaN in every output of its row, inf gives non-finite outputs; dense and gathered.
// The mma.sync kernel, and the wgmma kernel on Hopper.
void fp16_rows_of_every_magnitude(bool wgmma) {
  std::mt19937 rng(15);
  const int T = 70, in = 256;
  for (auto [bits, gs] : {Format{0, 0}, Format{4, 64}, Format{8, 32}}) {
    GemmWeights W = make_gemm_weights(bits, gs, 1, 136, in, rng);
    const int out = W.out;
    auto x = randn(size_t(T) * in, rng);
    for (int r = 0; r < T; ++r) {
      float sc = std::pow(10.0f, float(r % 9 - 4)) * (r % 5 == 4 ? 1e3f : 1.0f);
      if (r == 60) sc = 0.0f;
      if (r == 61) sc = 1e30f;
      if (r == 62) sc = 1e-30f;
      for (int k = 0; k < in; ++k) x[size_t(r) * in + k] *= sc;
    }
    x[size_t(63) * in + 17] = NAN;
    x[size_t(64) * in + 99] = INFINITY;
    std::vector<int> ex(T, 0), src(T);
    for (int t = 0; t < T; ++t) src[t] = t;
    GemmRef R = reference(W, x, in, ex, src);
    Dev<float> dx(x), dy(size_t(T) * out);
    dy.poison();
    if (wgmma)
      ASSERT_TRUE(lily::cuda::gemm_wgmma(W.m, out, in, dx.p, in, nullptr, dy.p, out, false, nullptr, nullptr, (T + 63) / 64,
                                         T, GemmPrec::kFp16, nullptr));
    else
      ASSERT_TRUE(lily::cuda::gemm_tc(W.m, out, in, dx.p, in, nullptr, dy.p, out, false, nullptr, nullptr, (T + 63) / 64, T,
                                      GemmPrec::kFp16, nullptr));
    const auto y = dy.down();
    const std::string what =
        W.name() + (wgmma ? (lily::cuda::kernel_switches().wgmma_rs ? " wgmma-rs" : " wgmma") : " mma.sync") + " fp16 wide rows";
    for (int r = 0; r < T; ++r)
      for (int o = 0; o < out; ++o) {
        const float v = y[size_t(r) * out + o];
        const double want = R.y[size_t(r) * out + o], lim = 1.01 * std::ldexp(1.0, -10) * R.scale[size_t(r) * out + o];
        if (r == 60) ASSERT_EQ(v, 0.0f) << what << " zero row, col " << o;
        else if (r == 63) ASSERT_TRUE(std::isnan(v)) << what << " NaN row, col " << o;
        else if (r == 64) ASSERT_FALSE(std::isfinite(v)) << what << " inf row, col " << o;
        else ASSERT_LE(std::fabs(double(v) - want), lim) << what << " row " << r << " col " << o;
      }
  }
}

TEST(CudaGemm, Fp16RowsOfEveryMagnitude) {
  LILY_REQUIRE_GPU();
  fp16_rows_of_every_magnitude(false);
}

// Shapes the tensor-core path declines (the SIMT kernel takes them through gemm_tiles).
TEST(CudaGemm, DeclinesUnsupportedShapes) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(13);
  GemmWeights W = make_gemm_weights(0, 0, 1, 8, 136, rng);
  Dev<float> dx(size_t(4) * 136), dy(size_t(4) * 8);
  EXPECT_FALSE(lily::cuda::gemm_tc(W.m, 8, 136, dx.p, 136, nullptr, dy.p, 8, false, nullptr, nullptr, 1, 4,
                                   GemmPrec::kSplit, nullptr));                   // in % 32 != 0
  EXPECT_FALSE(lily::cuda::gemm_tc(W.m, 8, 128, dx.p + 1, 136, nullptr, dy.p, 8, false, nullptr, nullptr, 1, 4,
                                   GemmPrec::kSplit, nullptr));                   // unaligned x
  GemmWeights A = make_gemm_weights(4, 64, 1, 8, 128, rng);
  Mat m = A.m;
  m.bits = 3;
  EXPECT_FALSE(lily::cuda::gemm_tc(m, 8, 128, dx.p, 136, nullptr, dy.p, 8, false, nullptr, nullptr, 1, 4,
                                   GemmPrec::kSplit, nullptr));                   // 3-bit codes
}

// ---- the Hopper kernels (gemm_wgmma.cu, gemm_wgmma_rs.cu): bf16 and fp16 operands, their bounds of expect_close ----
// The register-A kernel's layout (host only): rs_phys_k is a permutation of each 64-deep stage that gives thread c
// exactly physical k 16c .. 16c + 15, and rs_code_pair pulls, from thread c's words of a weight row, the codes
// rs_phys_k names for each slice s, fragment half v2 and pair element v0 (logical k 16s + 2c + 8v2 + v0, as the
// wgmma's register fragment holds it).
TEST(CudaGemmWgmma, RegisterLayout) {
  for (int bits : {4, 8, 16}) {
    SCOPED_TRACE(bits);
    std::vector<int> seen(64, 0);
    for (int kl = 0; kl < 64; ++kl) {
      const int p = lily::cuda::rs_phys_k(bits, kl);
      ASSERT_GE(p, 0);
      ASSERT_LT(p, 64);
      ++seen[size_t(p)];
      EXPECT_EQ(p / 16, (kl >> 1) & 3) << "kl " << kl;  // owned by thread c
    }
    for (int v : seen) EXPECT_EQ(v, 1);
    EXPECT_EQ(lily::cuda::rs_row_words(bits), bits * 2);
    // one thread's 16 values (codes 1..15 / distinct bytes / bf16 bit patterns), packed as the weight row holds them
    const uint32_t mask = bits == 16 ? 0xFFFFu : (1u << bits) - 1;
    uint32_t code[16], w[8] = {};
    for (int i = 0; i < 16; ++i) {
      code[i] = uint32_t(i * 7 + 3 + (bits == 16 ? 0x3C00 : 0)) & mask;
      w[i * bits / 32] |= code[i] << ((i * bits) % 32);
    }
    for (int c = 0; c < 4; ++c)
      for (int s = 0; s < 4; ++s)
        for (int v2 = 0; v2 < 2; ++v2) {
          const uint32_t pair = lily::cuda::rs_code_pair(bits, w, s, v2);
          for (int v0 = 0; v0 < 2; ++v0) {
            const int kl = 16 * s + 2 * c + 8 * v2 + v0, local = lily::cuda::rs_phys_k(bits, kl) - 16 * c;
            EXPECT_EQ((pair >> (16 * v0)) & 0xFFFFu, code[local]) << "c " << c << " s " << s << " v2 " << v2 << " v0 " << v0;
          }
        }
  }
}

// Both ways of the wgmma kernel's affine / fp16-mode products: weights dequantised in registers
// (KernelSwitches::wgmma_rs, the default) and by producer warps into shared memory.
const bool kRegisterA[] = {true, false};
// Expert tile maps as the MoE block builds them for it (tiles of 128 rows) and of 64 rows (gemm_tiles' other
// callers: one consumer warpgroup idles), experts with 0, 1, 15, 16, 17, 127, 128 and 129 rows (and 64, 65,
// 200, 300), gathered and plain inputs; K not a multiple of the 64-deep stage (96, 200, 544); outputs not a
// multiple of the 256-column unit.
TEST(CudaGemmWgmma, ExpertTilesMatchReference) {
  LILY_REQUIRE_GPU();
  if (!lily::cuda::gemm_wgmma_device()) GTEST_SKIP() << "needs an sm_90 device";
  std::mt19937 rng(21);
  for (bool rs : kRegisterA)
  for (int tile_rows : {128, 64}) {
    SwitchesScope scope([=](lily::cuda::KernelSwitches& k) { k.wgmma_rs = rs; });
    const TileMap m = make_tile_map({0, 1, 15, 16, 17, 127, 128, 129, 0, 64, 65, 200, 300}, 211, rng, tile_rows);
    for_each_tile_case(m, {{300, 256}, {130, 96}, {72, 544}, {40, 200}}, rng,
                       [&](const GemmWeights& W, const Dev<float>& dx, bool gathered, const GemmRef& R, const std::string& what) {
      const int out = W.out, in = W.in;
      Dev<float> dy(size_t(m.n) * out);
      for (GemmPrec prec : {GemmPrec::kBf16, GemmPrec::kFp16})
        check_both([&](bool acc) {
          return lily::cuda::gemm_wgmma(W.m, out, in, dx.p, in, gathered ? m.dgather->p : nullptr, dy.p, out, acc,
                                        m.tiles->p, m.n_tiles->p, m.max_tiles, m.n, prec, nullptr);
        }, dy, out, R, prec, what + " wgmma" + (rs ? "-rs " : " ") + prec_name(prec) + " tiles of " + std::to_string(tile_rows), rng);
    });
  }
}

TEST(CudaGemmWgmma, Fp16RowsOfEveryMagnitude) {
  LILY_REQUIRE_GPU();
  if (!lily::cuda::gemm_wgmma_device()) GTEST_SKIP() << "needs an sm_90 device";
  for (bool rs : kRegisterA) {
    SwitchesScope scope([=](lily::cuda::KernelSwitches& k) { k.wgmma_rs = rs; });
    fp16_rows_of_every_magnitude(true);
  }
}

// Dense rows down to M = 1, strided x and y, K tails.
TEST(CudaGemmWgmma, DenseMatchesReference) {
  LILY_REQUIRE_GPU();
  if (!lily::cuda::gemm_wgmma_device()) GTEST_SKIP() << "needs an sm_90 device";
  std::mt19937 rng(22);
  const std::pair<int, int> shapes[] = {{130, 256}, {257, 200}, {1, 64}, {520, 544}};
  for (bool rs : kRegisterA)
  for (auto [bits, gs] : kFormats)
    for (auto [out, in] : shapes) {
      if (bits && in % gs) continue;
      GemmWeights W = make_gemm_weights(bits, gs, 1, out, in, rng);
      for (int T : {1, 2, 17, 63, 64, 65, 129, 300}) {
        const int64_t ldx = in + 8, ldy = out + 3;
        auto x = randn(size_t(T) * ldx, rng);
        std::vector<int> ex(T, 0), src(T);
        for (int t = 0; t < T; ++t) src[t] = t;
        const GemmRef R = reference(W, x, ldx, ex, src);
        Dev<float> dx(x), dy(size_t(T) * ldy);
        for (GemmPrec prec : {GemmPrec::kBf16, GemmPrec::kFp16}) {
          SwitchesScope scope([=](lily::cuda::KernelSwitches& k) { k.wgmma_rs = rs; });
          const std::string what = W.name() + " wgmma" + (rs ? "-rs " : " ") + prec_name(prec) + " " +
                                   std::to_string(out) + "x" + std::to_string(in) + " T=" + std::to_string(T);
          dy.poison();
          ASSERT_TRUE(lily::cuda::gemm_wgmma(W.m, out, in, dx.p, ldx, nullptr, dy.p, ldy, false, nullptr, nullptr,
                                             (T + 63) / 64, T, prec, nullptr));
          expect_close(dy.down(), ldy, R, nullptr, out, prec, what);
        }
      }
    }
}

// What the kernel declines (gemm_tiles then takes the mma.sync kernel).
TEST(CudaGemmWgmma, TakesTheCoveredShapesOnly) {
  alignas(16) static float buf[64];
  Mat bf;
  bf.w = reinterpret_cast<const uint16_t*>(buf);
  bf.ld = 64;
  EXPECT_TRUE(lily::cuda::gemm_wgmma_takes(bf, 64, buf, 64));
  EXPECT_FALSE(lily::cuda::gemm_wgmma_takes(bf, 60, buf, 64));      // in % 8
  EXPECT_FALSE(lily::cuda::gemm_wgmma_takes(bf, 64, buf + 1, 64));  // unaligned x
  EXPECT_FALSE(lily::cuda::gemm_wgmma_takes(bf, 64, buf, 66));      // ldx % 4
  Mat af = bf;
  af.affine = true; af.q = reinterpret_cast<const uint32_t*>(buf); af.bits = 4; af.gs = 64; af.row_words = 8;
  EXPECT_TRUE(lily::cuda::gemm_wgmma_takes(af, 64, buf, 64));
  af.bits = 3;
  EXPECT_FALSE(lily::cuda::gemm_wgmma_takes(af, 64, buf, 64));      // 3-bit codes
  af.bits = 4; af.gs = 16;
  EXPECT_FALSE(lily::cuda::gemm_wgmma_takes(af, 64, buf, 64));      // group 16
  Mat ex = bf;
  ex.exl3 = true;
  EXPECT_FALSE(lily::cuda::gemm_wgmma_takes(ex, 64, buf, 64));      // EXL3: its own kernel
  EXPECT_FALSE(lily::cuda::gemm_wgmma(bf, 8, 64, buf, 64, nullptr, buf, 8, false, nullptr, nullptr, 1, 1,
                                      GemmPrec::kSplit, nullptr));  // the split mode: mma.sync
}

// ---- timing (LILY_CUDA_BENCH=1) ----
struct BenchMat {
  Dev<uint16_t> w, s, b;
  Dev<uint32_t> q;
  Mat m;
  BenchMat(int bits, int E, int out, int in)
      : w(bits ? 1 : size_t(E) * out * in), s(bits ? size_t(E) * out * (in / 64) : 1),
        b(bits ? size_t(E) * out * (in / 64) : 1), q(bits ? size_t(E) * out * in * bits / 32 : 1) {
    if (bits == 0) {
      LILY_CU(cudaMemset(w.p, 0x3c, w.n * 2));  // bf16 0x3c3c ≈ 0.0115
      m = Mat::bf16(w.p, in, int64_t(out) * in);
      return;
    }
    LILY_CU(cudaMemset(q.p, 0x5a, q.n * 4));
    LILY_CU(cudaMemset(s.p, 0x3c, s.n * 2));
    LILY_CU(cudaMemset(b.p, 0xbc, b.n * 2));
    m.affine = true; m.q = q.p; m.s = s.p; m.b = b.p; m.bits = bits; m.gs = 64;
    m.row_words = int64_t(in) * bits / 32;
    m.qstride = int64_t(out) * m.row_words;
    m.sstride = int64_t(out) * (in / 64);
  }
};

TEST(CudaGemmBench, RealShapes) {
  const char* env = std::getenv("LILY_CUDA_BENCH");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set LILY_CUDA_BENCH=1";
  LILY_REQUIRE_GPU();
  cudaEvent_t e0, e1;
  LILY_CU(cudaEventCreate(&e0));
  LILY_CU(cudaEventCreate(&e1));
  struct Shape {
    const char* name;
    int out, in, rows, E;  // E > 0: E experts × `rows` rows each through a tile map
  };
  const Shape shapes[] = {{"GDN in-proj T=4096", 12352, 2048, 4096, 0},
                          {"attn q|gate T=4096", 8192, 2048, 4096, 0},
                          {"o-proj T=4096", 2048, 4096, 4096, 0},
                          {"experts gate|up 256x128", 1024, 2048, 128, 256},
                          {"experts down 256x128", 2048, 512, 128, 256}};
  std::printf("| shape | weights | precision | ms | TFLOP/s |\n|---|---|---|---|---|\n");
  for (int bits : {0, 4})
    for (const Shape& sh : shapes) {
      const int E = std::max(sh.E, 1);
      const int n = sh.E ? sh.E * sh.rows : sh.rows;
      const int tokens = sh.E ? n / 8 : n;  // experts: top-8 slots of n/8 tokens
      BenchMat W(bits, E, sh.out, sh.in);
      Dev<float> dx(size_t(tokens) * sh.in), dy(size_t(n) * sh.out);
      LILY_CU(cudaMemset(dx.p, 0x3c, dx.n * 4));
      std::vector<int32_t> tiles, gather(n);
      for (int e = 0; e < sh.E; ++e)
        for (int r = 0; r < sh.rows; r += 64) tiles.insert(tiles.end(), {e, e * sh.rows + r, std::min(64, sh.rows - r)});
      for (int r = 0; r < n; ++r) gather[r] = sh.E ? int((int64_t(r) * 7919) % tokens) : r;
      const int nt = int(tiles.size() / 3);
      Dev<int32_t> dt(tiles.empty() ? std::vector<int32_t>{0} : tiles), dn(std::vector<int32_t>{nt}), dg(gather);
      for (GemmPrec prec : kPrecs) {
        auto run = [&] {
          if (sh.E)
            lily::cuda::gemm_tc(W.m, sh.out, sh.in, dx.p, sh.in, dg.p, dy.p, sh.out, false, dt.p, dn.p, nt, n, prec, nullptr);
          else
            lily::cuda::gemm_tc(W.m, sh.out, sh.in, dx.p, sh.in, nullptr, dy.p, sh.out, false, nullptr, nullptr,
                                (n + 63) / 64, n, prec, nullptr);
        };
        run();
        LILY_CU(cudaDeviceSynchronize());
        const int reps = 10;
        LILY_CU(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) run();
        LILY_CU(cudaEventRecord(e1));
        LILY_CU(cudaEventSynchronize(e1));
        float ms = 0;
        LILY_CU(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        const double flop = 2.0 * n * double(sh.out) * sh.in;
        std::printf("| %s (%dx%d, %d rows) | %s | %s | %.3f | %.1f |\n", sh.name, sh.out, sh.in, n,
                    bits ? "affine4-g64" : "bf16", prec_name(prec), ms, flop / (ms * 1e-3) / 1e12);
      }
    }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
#endif
