// The multi-row products (backend/cuda/rows.h) against a double-precision reference at awkward sizes, in
// every format they take: dense products of 1..32 rows (plain, accumulate, SwiGLU, through linear()), a
// row's bits independent of the other rows of the step, and expert tile maps with experts chosen by no row,
// by one, by all and by more rows than a tile holds.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaRows, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <cstring>
#include <memory>
#include <string>

#include "backend/cuda/rows.h"
#include "backend/cuda/switches.h"
#include "cuda_test_util.h"
#include "quant/affine/affine.h"

namespace {
using namespace lily::cudatest;
namespace cu = lily::cuda;

const int kTs[] = {1, 2, 3, 5, 8, 16, 17, 32};

// E stacked [rows, in] matrices on the device and their values as the kernels read them.
struct RowsWeights {
  std::string name;
  cu::Mat m;
  std::vector<float> f;  // [E][rows][in]
  std::unique_ptr<Dev<uint16_t>> w, s, b;
  std::unique_ptr<Dev<uint32_t>> q;
  int rows = 0, in = 0;
  float at(int e, int r, int i) const { return f[(size_t(e) * rows + r) * in + i]; }
};

// mode 0: bf16; 4 / 8: affine bits with group gs.
RowsWeights make_rows_weights(int mode, int gs, int E, int rows, int in, std::mt19937& rng) {
  RowsWeights W;
  W.rows = rows;
  W.in = in;
  if (mode == 0) {
    W.name = "bf16";
    auto [b, f] = randn_bf16(size_t(E) * rows * in, rng, 1.f / std::sqrt(float(in)));
    W.f = f;
    W.w = std::make_unique<Dev<uint16_t>>(b);
    W.m = cu::Mat::bf16(W.w->p, in, int64_t(rows) * in);
    return W;
  }
  W.name = "affine " + std::to_string(mode) + "-bit g" + std::to_string(gs);
  auto wf = randn(size_t(E) * rows * in, rng, 0.05f);
  auto qz = lily::quant::affine_quantize(wf.data(), int64_t(E) * rows, in, mode, gs);
  auto view = qz.view();
  W.f.resize(size_t(E) * rows * in);
  for (int64_t r = 0; r < int64_t(E) * rows; ++r) lily::quant::affine_dequant_row_ref(view, r, W.f.data() + size_t(r) * in);
  W.q = std::make_unique<Dev<uint32_t>>(qz.packed);
  W.s = std::make_unique<Dev<uint16_t>>(qz.scales);
  W.b = std::make_unique<Dev<uint16_t>>(qz.biases);
  cu::Mat& m = W.m;
  m.affine = true; m.q = W.q->p; m.s = W.s->p; m.b = W.b->p; m.bits = mode; m.gs = gs;
  m.row_words = int64_t(in) * mode / 32;
  m.qstride = int64_t(rows) * m.row_words; m.sstride = int64_t(rows) * (in / gs);
  return W;
}

// Every format the products take, for a stack of E [rows, in] matrices.
std::vector<RowsWeights> all_formats(int E, int rows, int in, std::mt19937& rng) {
  std::vector<RowsWeights> v;
  v.push_back(make_rows_weights(0, 0, E, rows, in, rng));
  for (int bits : {4, 8})
    for (int gs : {64, 128})
      if (in % gs == 0) v.push_back(make_rows_weights(bits, gs, E, rows, in, rng));
  return v;
}

// Row r of the product: x row xr against expert e; swiglu_I > 0: silu(gate)·up for outputs [0, I).
std::vector<double> ref_row(const RowsWeights& W, int e, const float* x, int out, int swiglu_I) {
  auto dot = [&](int o) {
    double s = 0;
    for (int i = 0; i < W.in; ++i) s += double(W.at(e, o, i)) * x[i];
    return s;
  };
  std::vector<double> y;
  if (swiglu_I > 0) {
    for (int o = 0; o < swiglu_I; ++o) {
      const double g = dot(o), u = dot(o + swiglu_I);
      y.push_back(g / (1 + std::exp(-g)) * u);
    }
  } else {
    for (int o = 0; o < out; ++o) y.push_back(dot(o));
  }
  return y;
}

struct RowsSwitches {
  cu::KernelSwitches saved = cu::kernel_switches();
  RowsSwitches(int dense, int moe, int min_rows) {
    auto k = saved;
    k.rows_dense = dense;
    k.rows_moe = moe;
    k.rows_min = min_rows;
    cu::set_kernel_switches(k);
  }
  ~RowsSwitches() { cu::set_kernel_switches(saved); }
};

}  // namespace

// The kernel's pipeline settings (KernelSwitches::rows_depth, rows_waves, rows_half, rows_stage): the defaults
// (staged), unstaged, a deeper register ring (unstaged), fewer k splits (chunk counts per warp not a multiple of
// the depth), 16 rows a warp.
struct Pipeline {
  int depth, waves;
  bool half;
  int stage;
};
const Pipeline kPipelines[] = {{2, 8, false, 2}, {2, 8, false, 0}, {4, 8, false, 0}, {4, 2, false, 2},
                               {4, 1, false, 0}, {4, 8, true, 0},  {2, 16, true, 2}, {2, 1, true, 2}};
cu::KernelSwitches with_pipeline(cu::KernelSwitches k, const Pipeline& p) {
  k.rows_depth = p.depth;
  k.rows_waves = p.waves;
  k.rows_half = p.half;
  k.rows_stage = p.stage;
  return k;
}

TEST(CudaRows, DenseProductsMatchReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(11);
  // k split over 8 warps (16 x 8192) down to none (16 x 64)
  const std::pair<int, int> shapes[] = {{65, 256}, {130, 2048}, {16, 64}, {300, 192}, {16, 8192}};
  for (const Pipeline& pl : kPipelines) {
    SwitchesScope pipe([&](cu::KernelSwitches& k) { k = with_pipeline(k, pl); });
    for (auto [out, in] : shapes)
      for (const RowsWeights& W : all_formats(1, out, in, rng))
        for (int T : kTs)
          for (int variant = 0; variant < 4; ++variant) {  // plain, accumulate, SwiGLU, RMSNorm of x inside
            const int I = variant == 2 ? out / 2 : 0;
            const int ny = I > 0 ? I : out;
            auto x = randn(size_t(T) * in, rng);
            auto y0 = randn(size_t(T) * ny, rng);
            auto nw = randn(size_t(in), rng);
            Dev<float> dx(x), dy(y0), dnw(nw);
            if (variant != 1) dy.poison();
            const float eps = 1e-6f;
            ASSERT_TRUE(cu::rows_product(W.m, out, in, dx.p, in, nullptr, dy.p, ny, variant == 1, I, nullptr, nullptr, 0, T,
                                         nullptr, variant == 3 ? dnw.p : nullptr, eps))
                << W.name;
            std::vector<double> ref;
            for (int t = 0; t < T; ++t) {
              std::vector<float> xt(x.begin() + ptrdiff_t(t) * in, x.begin() + ptrdiff_t(t + 1) * in);
              if (variant == 3) {
                double ss = 0;
                for (float v : xt) ss += double(v) * v;
                const double inv = 1.0 / std::sqrt(ss / in + eps);
                for (int i = 0; i < in; ++i) xt[size_t(i)] = float(xt[size_t(i)] * inv * nw[size_t(i)]);
              }
              auto r = ref_row(W, 0, xt.data(), out, I);
              for (int o = 0; o < ny; ++o) ref.push_back(r[size_t(o)] + (variant == 1 ? y0[size_t(t) * ny + o] : 0.0));
            }
            // x as bf16 hi + lo leaves ~2^-17 of each element (rms ~4e-6 of a product); SwiGLU compounds the
            // errors of its two products (silu(g)·u), so its bound is twice the plain one.
            EXPECT_LT(rel_err(dy.down(), ref), variant == 2 ? 2e-5 : 1e-5)
                << W.name << " " << out << "x" << in << " T=" << T << " variant " << variant << " depth " << pl.depth
                << " waves " << pl.waves << " half " << pl.half << " stage " << pl.stage;
          }
  }
}

// linear() dispatches rows_min..rows_dense rows to the product (rows_min 3 here; fewer rows stay on the GEMV).
TEST(CudaRows, LinearTakesRowsBetweenTwoAndTheSwitch) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(12);
  RowsSwitches on(32, 32, 3);
  const int out = 96, in = 320;
  for (const RowsWeights& W : all_formats(1, out, in, rng))
    for (int T : kTs) {
      auto x = randn(size_t(T) * in, rng);
      Dev<float> dx(x), dy(size_t(T) * out);
      dy.poison();
      cu::linear(W.m, out, in, dx.p, in, T, dy.p, out, false, nullptr);
      std::vector<double> ref;
      for (int t = 0; t < T; ++t) {
        auto r = ref_row(W, 0, x.data() + size_t(t) * in, out, 0);
        ref.insert(ref.end(), r.begin(), r.end());
      }
      EXPECT_LT(rel_err(dy.down(), ref), 1e-5) << W.name << " T=" << T;
    }
}

// A row's result is the same bits whichever rows share the product (2, 9 or 32 rows; other inputs).
TEST(CudaRows, RowBitsIndependentOfTheOtherRows) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(13);
  const int out = 200, in = 1024;
  {
    for (const RowsWeights& W : all_formats(1, out, in, rng)) {
      auto x32 = randn(size_t(32) * in, rng);
      auto first = [&](int T, bool other) {
        auto x = x32;
        if (other)
          for (size_t i = size_t(2) * in; i < x.size(); ++i) x[i] = -x[i] * 0.5f;
        Dev<float> dx(std::vector<float>(x.begin(), x.begin() + std::ptrdiff_t(size_t(T) * in))), dy(size_t(T) * out);
        EXPECT_TRUE(cu::rows_product(W.m, out, in, dx.p, in, nullptr, dy.p, out, false, 0, nullptr, nullptr, 0, T, nullptr));
        auto y = dy.down();
        return std::vector<float>(y.begin(), y.begin() + 2 * out);
      };
      const auto a = first(2, false);
      EXPECT_EQ(first(9, false), a) << W.name;
      EXPECT_EQ(first(32, false), a) << W.name;
      EXPECT_EQ(first(32, true), a) << W.name;
    }
  }
}

// Expert tile maps: expert 0 chosen by no row, 1 by one, 2 by every token (three tiles), 3 by exactly one
// full tile, 4 by three; dead tiles past *n_tiles; rows gathered from token rows.
TEST(CudaRows, ExpertTilesMatchReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(14);
  const int E = 5, out = 96, in = 1024, NX = 17;
  const int per_expert[E] = {0, 1, NX, cu::kRowsTile, 3};
  std::vector<int32_t> gather, expert_of, tiles;
  for (int e = 0; e < E; ++e) {
    const int row0 = int(gather.size());
    for (int i = 0; i < per_expert[e]; ++i) {
      gather.push_back(e == 2 ? i : int32_t(rng() % NX));
      expert_of.push_back(e);
    }
    for (int i = 0; i < per_expert[e]; i += cu::kRowsTile)
      tiles.insert(tiles.end(), {e, row0 + i, std::min(cu::kRowsTile, per_expert[e] - i)});
  }
  const int n = int(gather.size()), live = int(tiles.size()) / 3, max_tiles = live + 3;
  tiles.resize(size_t(3) * max_tiles, 0);
  Dev<int32_t> dg(gather), dt(tiles), dn(std::vector<int32_t>{live});
  for (const Pipeline& pl : kPipelines) {
    SwitchesScope pipe([&](cu::KernelSwitches& k) { k = with_pipeline(k, pl); });
    for (const RowsWeights& W : all_formats(E, out, in, rng))
      for (int I : {0, out / 2}) {
        const int ny = I > 0 ? I : out;
        auto x = randn(size_t(NX) * in, rng);
        Dev<float> dx(x), dy(size_t(n) * ny);
        dy.poison();
        ASSERT_TRUE(cu::rows_product(W.m, out, in, dx.p, in, dg.p, dy.p, ny, false, I, dt.p, dn.p, max_tiles, n, nullptr,
                                     nullptr, 1e-6f, NX));
        std::vector<double> ref;
        for (int p = 0; p < n; ++p) {
          auto r = ref_row(W, expert_of[size_t(p)], x.data() + size_t(gather[size_t(p)]) * in, out, I);
          ref.insert(ref.end(), r.begin(), r.end());
        }
        EXPECT_LT(rel_err(dy.down(), ref), 1e-5) << W.name << " swiglu " << I << " depth " << pl.depth << " waves " << pl.waves
                                            << " half " << pl.half << " stage " << pl.stage;
      }
  }
}

// The staging pass (KernelSwitches::rows_stage) changes no bit: dense products of 1..32 rows in every variant
// (plain, accumulate, SwiGLU, RMSNorm inside) and expert tiles gathered from token rows, staged and not.
TEST(CudaRows, StagedRowsGiveTheSameBits) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(16);
  auto run = [&](int stage, auto&& product) {
    SwitchesScope scope([&](cu::KernelSwitches& k) { k.rows_stage = stage; });
    return product();
  };
  for (auto [out, in] : {std::pair<int, int>{130, 2048}, {64, 576}, {48, 64}})
    for (const RowsWeights& W : all_formats(1, out, in, rng))
      for (int T : kTs)
        for (int variant = 0; variant < 4; ++variant) {
          const int I = variant == 2 ? out / 2 : 0, ny = I > 0 ? I : out;
          const auto x = randn(size_t(T) * in, rng), y0 = randn(size_t(T) * ny, rng), nw = randn(size_t(in), rng);
          Dev<float> dx(x), dnw(nw);
          auto product = [&] {
            Dev<float> dy(y0);
            EXPECT_TRUE(cu::rows_product(W.m, out, in, dx.p, in, nullptr, dy.p, ny, variant == 1, I, nullptr, nullptr, 0, T,
                                         nullptr, variant == 3 ? dnw.p : nullptr, 1e-6f));
            return dy.down();
          };
          const auto plain = run(0, product), staged = run(2, product);
          ASSERT_EQ(plain.size(), staged.size());
          EXPECT_EQ(0, std::memcmp(plain.data(), staged.data(), plain.size() * sizeof(float)))
              << W.name << " " << out << "x" << in << " T=" << T << " variant " << variant;
        }
  // expert tiles: 20 slots of 6 token rows over 4 experts (one chosen by none), the last tile dead
  const int E = 4, out = 96, in = 1024, NX = 6;
  std::vector<int32_t> gather, tiles;
  const int per_expert[E] = {3, 0, cu::kRowsTile + 4, 5};
  for (int e = 0; e < E; ++e) {
    const int row0 = int(gather.size());
    for (int i = 0; i < per_expert[e]; ++i) gather.push_back(int32_t(rng() % NX));
    for (int i = 0; i < per_expert[e]; i += cu::kRowsTile)
      tiles.insert(tiles.end(), {e, row0 + i, std::min(cu::kRowsTile, per_expert[e] - i)});
  }
  const int n = int(gather.size()), live = int(tiles.size()) / 3, max_tiles = live + 1;
  tiles.resize(size_t(3) * max_tiles, 0);
  Dev<int32_t> dg(gather), dt(tiles), dn(std::vector<int32_t>{live});
  for (const RowsWeights& W : all_formats(E, out, in, rng))
    for (int I : {0, out / 2}) {
      const int ny = I > 0 ? I : out;
      Dev<float> dx(randn(size_t(NX) * in, rng));
      auto product = [&] {
        Dev<float> dy(size_t(n) * ny);
        dy.poison();
        EXPECT_TRUE(cu::rows_product(W.m, out, in, dx.p, in, dg.p, dy.p, ny, false, I, dt.p, dn.p, max_tiles, n, nullptr,
                                     nullptr, 1e-6f, NX));
        return dy.down();
      };
      const auto plain = run(0, product), staged = run(1, product);
      EXPECT_EQ(0, std::memcmp(plain.data(), staged.data(), plain.size() * sizeof(float))) << W.name << " swiglu " << I;
    }
}

TEST(CudaRows, DeclinesWhatItDoesNotCover) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(15);
  RowsWeights W = make_rows_weights(0, 0, 1, 32, 96, rng);  // in not a multiple of 64
  Dev<float> dx(size_t(4) * 96), dy(size_t(4) * 32);
  EXPECT_FALSE(cu::rows_covers(W.m, 96));
  EXPECT_FALSE(cu::rows_product(W.m, 32, 96, dx.p, 96, nullptr, dy.p, 32, false, 0, nullptr, nullptr, 0, 4, nullptr));
  RowsWeights A = make_rows_weights(4, 32, 1, 32, 128, rng);  // group size 32
  EXPECT_FALSE(cu::rows_covers(A.m, 128));
  cu::Mat ex;
  ex.exl3 = true;
  EXPECT_FALSE(cu::rows_covers(ex, 128));
  RowsWeights B = make_rows_weights(4, 64, 1, 32, 128, rng);
  EXPECT_FALSE(cu::rows_product(B.m, 32, 128, dx.p, 128, nullptr, dy.p, 32, false, 0, nullptr, nullptr, 0, cu::kRowsMax + 1,
                                nullptr));
}

#endif
