// EXL3 MoE products on the CUDA backend: expert slots (SwiGLU gate‖up with the fused RMSNorm, down) and the
// prompt tile map against exl3_forward_ref (float64); the decode down product that adds the weighted slots into
// the residual itself (exl3_gemv_combine) against the slots' outputs combined in float64.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaExl3Moe, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "exl3_test_util.h"

using namespace lily;
using lily::cudatest::Dev;
using lily::cudatest::DevExl3;
using lily::cudatest::HighPrecisionScope;
using lily::cudatest::HostExl3;
using lily::cudatest::SwitchesScope;
using lily::cudatest::randn;
using lily::cudatest::rel_err;
using lily::cudatest::silu;
using quant::Exl3Codebook;

namespace {

// MoE: gemv_slots with expert indices (swiglu gate/up with fused RMSNorm, then down) and gemm_tiles over a
// tile map with experts of 0, 1 and many rows, gathered input rows, and dead tiles past *n_tiles.
TEST(CudaExl3Moe, SlotsAndTiles) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // fp32-class tolerances (both precisions: LinearMatchesReference)
  std::mt19937 rng(11);
  const int E = 5, H = 192, I = 200;
  for (int cb = 0; cb < 3; ++cb) {
    const int K = 2 + 2 * cb;
    std::vector<std::unique_ptr<HostExl3>> g, u, dn;
    for (int e = 0; e < E; ++e) {
      g.push_back(std::make_unique<HostExl3>(K, Exl3Codebook(cb), H, I, rng));
      u.push_back(std::make_unique<HostExl3>(K, Exl3Codebook(cb), H, I, rng));
      dn.push_back(std::make_unique<HostExl3>(K, Exl3Codebook(cb), I, H, rng));
    }
    std::vector<const HostExl3*> gu, dd;
    for (int e = 0; e < E; ++e) { gu.push_back(g[size_t(e)].get()); gu.push_back(u[size_t(e)].get()); dd.push_back(dn[size_t(e)].get()); }
    DevExl3 mgu(gu, 2), mdn(dd, 1);
    // decode slots: 2 tokens x 3 choices, x row = slot / 3
    const std::vector<int32_t> ex = {3, 0, 4, 4, 1, 3};
    const int slots = int(ex.size()), T = 2;
    auto x = randn(size_t(T) * H, rng, 2.f);
    auto nw = randn(size_t(H), rng);
    std::vector<float> xn(x.size());
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int i = 0; i < H; ++i) ss += double(x[size_t(t * H + i)]) * x[size_t(t * H + i)];
      const double inv = 1.0 / std::sqrt(ss / H + 1e-6);
      for (int i = 0; i < H; ++i) xn[size_t(t * H + i)] = float(x[size_t(t * H + i)] * inv * nw[size_t(i)]);
    }
    std::vector<double> hw(size_t(slots) * I), yw(size_t(slots) * H);
    for (int s = 0; s < slots; ++s) {
      std::vector<float> xr(xn.begin() + (s / 3) * H, xn.begin() + (s / 3 + 1) * H);
      auto gr = g[size_t(ex[size_t(s)])]->ref(xr, 1), ur = u[size_t(ex[size_t(s)])]->ref(xr, 1);
      for (int r = 0; r < I; ++r) hw[size_t(s * I + r)] = silu(gr[size_t(r)]) * ur[size_t(r)];
    }
    Dev<float> dx(x), dn_w(nw), dh(size_t(slots) * I), dyb(size_t(slots) * H);
    Dev<int32_t> dex(ex);
    cuda::gemv_slots(mgu.m, dex.p, 0, H, dx.p, H, 3, slots, dh.p, I, false, I, nullptr, dn_w.p, 1e-6f);
    auto hgot = dh.down();
    EXPECT_LT(rel_err(hgot, hw), 2e-5) << "swiglu slots cb " << cb;
    for (int s = 0; s < slots; ++s) {
      std::vector<float> hr(hgot.begin() + s * I, hgot.begin() + (s + 1) * I);
      auto yr = dn[size_t(ex[size_t(s)])]->ref(hr, 1);
      std::copy(yr.begin(), yr.end(), yw.begin() + s * H);
    }
    cuda::gemv_slots(mdn.m, dex.p, H, I, dh.p, I, 1, slots, dyb.p, H, false, 0, nullptr);
    EXPECT_LT(rel_err(dyb.down(), yw), 2e-5) << "down slots cb " << cb;

    // prompt tiles: expert rows {0, 70, 1, 0, 129}, rows gathered from a 150-row x
    const int counts[E] = {0, 70, 1, 0, 129};
    const int XT = 150;
    auto xp = randn(size_t(XT) * H, rng);
    std::vector<int32_t> tiles, gather;
    std::vector<int> row_e;
    int n = 0;
    for (int e = 0; e < E; ++e) {
      for (int r = 0; r < counts[e]; r += 64) tiles.insert(tiles.end(), {e, n + r, std::min(64, counts[e] - r)});
      for (int r = 0; r < counts[e]; ++r) { gather.push_back(int32_t(rng() % XT)); row_e.push_back(e); }
      n += counts[e];
    }
    const int live = int(tiles.size() / 3), max_tiles = live + 3;
    tiles.resize(size_t(max_tiles) * 3, 0);  // dead tiles: never read
    Dev<float> dxp(xp), dgu(size_t(n) * 2 * I), dhp(size_t(n) * I), dy2(size_t(n) * H);
    Dev<int32_t> dtiles(tiles), dnt(std::vector<int32_t>{live}), dg(gather);
    dgu.poison();
    cuda::gemm_tiles(mgu.m, 2 * I, H, dxp.p, H, dg.p, dgu.p, 2 * I, false, dtiles.p, dnt.p, max_tiles, n, nullptr);
    auto gu_got = dgu.down();
    std::vector<double> gu_want(size_t(n) * 2 * I);
    for (int r = 0; r < n; ++r) {
      std::vector<float> xr(xp.begin() + gather[size_t(r)] * H, xp.begin() + (gather[size_t(r)] + 1) * H);
      auto gr = g[size_t(row_e[size_t(r)])]->ref(xr, 1), ur = u[size_t(row_e[size_t(r)])]->ref(xr, 1);
      std::copy(gr.begin(), gr.end(), gu_want.begin() + r * 2 * I);
      std::copy(ur.begin(), ur.end(), gu_want.begin() + r * 2 * I + I);
    }
    EXPECT_LT(rel_err(gu_got, gu_want), 2e-5) << "gate/up tiles cb " << cb;
    // down over the same tile map, x = the (host) swiglu of the gate/up rows, no gather
    std::vector<float> hp(size_t(n) * I);
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < I; ++c)
        hp[size_t(r * I + c)] = float(silu(gu_got[size_t(r * 2 * I + c)]) * gu_got[size_t(r * 2 * I + I + c)]);
    dhp.up(hp);
    cuda::gemm_tiles(mdn.m, H, I, dhp.p, I, nullptr, dy2.p, H, false, dtiles.p, dnt.p, max_tiles, n, nullptr);
    std::vector<double> y2(size_t(n) * H);
    for (int r = 0; r < n; ++r) {
      std::vector<float> hr(hp.begin() + r * I, hp.begin() + (r + 1) * I);
      auto yr = dn[size_t(row_e[size_t(r)])]->ref(hr, 1);
      std::copy(yr.begin(), yr.end(), y2.begin() + r * H);
    }
    EXPECT_LT(rel_err(dy2.down(), y2), 2e-5) << "down tiles cb " << cb;
  }
}

// The down product with the combine (exl3_gemv_combine): T tokens of kk slots, experts repeated within and
// across tokens and some chosen by none, outputs that end inside a column block (H 200) or fill several, a
// column map; x[t] += Σ_j w[t·kk + j] · down_{e(t,j)}(h[t·kk + j]) against the same sums in float64 over
// the slots' outputs from gemv_slots (one fp32 rounding of each product and sum apart: 1e-6). A second launch
// on the same residual adds the same amounts (the counters are back at zero). Declined, launching nothing:
// without the stream's scratch, with the switch off, a two-part stack, a product that would split k.
TEST(CudaExl3Moe, DownCombineMatchesSlots) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(47);
  struct Scratch {  // the split scratch of the default stream the launches below use
    Scratch() { cuda::exl3_split_scratch_acquire(nullptr); }
    ~Scratch() { cuda::exl3_split_scratch_release(nullptr); }
  };
  auto scratch = std::make_unique<Scratch>();
  // unsplit (the 35B-A3B shape's down product does not split at 1-3 tokens; the others might)
  auto nosplit = std::make_unique<SwitchesScope>([](cuda::KernelSwitches& k) {
    k.exl3_gemv_split = 0;
    k.exl3_down_combine = true;  // off by default
  });
  for (auto [K, cb, H, I, kk, map] : {std::tuple{4, 1, 2048, 512, 9, false}, std::tuple{3, 0, 200, 384, 3, false},
                                      std::tuple{2, 2, 384, 256, 4, true}, std::tuple{5, 1, 256, 1024, 11, false}}) {
    const int E = 7;
    std::vector<std::unique_ptr<HostExl3>> dn;
    for (int e = 0; e < E; ++e) {
      dn.push_back(std::make_unique<HostExl3>(K, Exl3Codebook(cb), I, H, rng, e % 2 == 1));
      if (map) {  // logical output j at padded column (j·37 + 11) mod out_p
        for (int j = 0; j < H; ++j) dn.back()->out_rows.push_back(int32_t((j * 37 + 11) % int(dn.back()->w.out_p)));
        dn.back()->fix();
      }
    }
    std::vector<const HostExl3*> dd;
    for (auto& d : dn) dd.push_back(d.get());
    DevExl3 m(dd, 1);
    for (int T : {1, 2, 3}) {
      const std::string what = "K " + std::to_string(K) + " H " + std::to_string(H) + " kk " + std::to_string(kk) +
                               " T " + std::to_string(T) + (map ? " map" : "");
      const int slots = T * kk;
      std::vector<int32_t> ex(static_cast<size_t>(slots));
      for (int s = 0; s < slots; ++s) ex[size_t(s)] = int32_t(s % kk == 1 ? ex[size_t(s - 1)] : (s * 5 + T) % (E - 1));
      auto h = randn(size_t(slots) * I, rng);
      auto w = randn(size_t(slots), rng);
      auto x0 = randn(size_t(T) * H, rng);
      Dev<int32_t> dex(ex);
      Dev<float> dh(h), dw(w), dyb(size_t(slots) * H), dx(x0);
      cuda::gemv_slots(m.m, dex.p, H, I, dh.p, I, 1, slots, dyb.p, H, false, 0, nullptr);
      const auto yb = dyb.down();
      std::vector<double> want(size_t(T) * H);
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < H; ++r) {
          double acc = x0[size_t(t * H + r)];
          for (int j = 0; j < kk; ++j) acc += double(w[size_t(t * kk + j)]) * yb[size_t((t * kk + j) * H + r)];
          want[size_t(t * H + r)] = acc;
        }
      ASSERT_TRUE(cuda::exl3_gemv_combine(m.m, dex.p, H, I, dh.p, I, dw.p, kk, T, dx.p, H, nullptr)) << what;
      const auto got = dx.down();
      EXPECT_LT(rel_err(got, want), 1e-6) << what;
      // again on the result: adds the same sums, so against x0 + 2·Σ
      std::vector<double> want2(want.size());
      for (size_t i = 0; i < want.size(); ++i) want2[i] = 2 * want[i] - x0[i];
      ASSERT_TRUE(cuda::exl3_gemv_combine(m.m, dex.p, H, I, dh.p, I, dw.p, kk, T, dx.p, H, nullptr)) << what;
      EXPECT_LT(rel_err(dx.down(), want2), 2e-6) << what << " (second launch)";
    }
  }
  nosplit.reset();
  // declined: nothing launched, x untouched (the switch on, so that each case declines for its own reason)
  SwitchesScope combine_on([](cuda::KernelSwitches& k) { k.exl3_down_combine = true; });
  HostExl3 a(4, Exl3Codebook::Mcg, 2048, 128, rng), b(4, Exl3Codebook::Mcg, 2048, 128, rng);
  DevExl3 one({&a}, 1), two({&a, &b}, 2);
  const auto x0 = randn(128, rng);
  Dev<int32_t> dex(std::vector<int32_t>{0});
  Dev<float> dh(randn(2048, rng)), dw(std::vector<float>{0.5f}), dx(x0);
  EXPECT_FALSE(cuda::exl3_gemv_combine(two.m, dex.p, 256, 2048, dh.p, 2048, dw.p, 1, 1, dx.p, 256, nullptr)) << "two parts";
  {
    SwitchesScope sw([](cuda::KernelSwitches& k) { k.exl3_gemv_split = 2; });
    EXPECT_FALSE(cuda::exl3_gemv_combine(one.m, dex.p, 128, 2048, dh.p, 2048, dw.p, 1, 1, dx.p, 128, nullptr)) << "split k";
  }
  {
    SwitchesScope sw([](cuda::KernelSwitches& k) { k.exl3_down_combine = false; });
    EXPECT_FALSE(cuda::exl3_gemv_combine(one.m, dex.p, 128, 2048, dh.p, 2048, dw.p, 1, 1, dx.p, 128, nullptr)) << "switch off";
  }
  scratch.reset();
  {
    SwitchesScope sw([](cuda::KernelSwitches& k) { k.exl3_gemv_split = 0; });
    EXPECT_FALSE(cuda::exl3_gemv_combine(one.m, dex.p, 128, 2048, dh.p, 2048, dw.p, 1, 1, dx.p, 128, nullptr)) << "no scratch";
  }
  EXPECT_EQ(dx.down(), x0);
}

}  // namespace
#endif
