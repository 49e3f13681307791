// EXL3 on the CUDA backend: bit-exact tile decode against the golden vectors, GEMV / GEMM / MoE slots and
// tiles against exl3_forward_ref (float64) at awkward sizes, every K and codebook, and whole models (a
// golden model quantized to EXL3 K4, a tiny synthetic EXL3 model) against the CPU backend.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaExl3, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "backend/cpu/cpu_backend.h"
#include "cuda_compare.h"
#include "cuda_test_util.h"
#include "exl3_test_util.h"
#include "io/safetensors.h"
#include "model/qwen_hybrid.h"
#include "model/weights.h"
#include "quant/exl3/exl3.h"
#include "tools/quantize.h"
#include "tools/synth.h"

namespace fs = std::filesystem;
using namespace lily;
using lily::cudatest::compare_backends;
using lily::cudatest::Dev;
using lily::cudatest::HighPrecisionScope;
using lily::cudatest::SwitchesScope;
using lily::cudatest::randn;
using lily::cudatest::rel_err;
using quant::Exl3Codebook;
using lily::cudatest::DevExl3;
using lily::cudatest::HostExl3;
using lily::cudatest::silu;

namespace {

const int kRows[] = {1, 2, 3, 5, 8, 16, 17, 32, 63, 64, 65, 129};

const TensorInfo& tensor(const SafeTensorsFile& f, const std::string& n) {
  auto it = f.tensors().find(n);
  if (it == f.tensors().end()) throw std::runtime_error("missing " + n);
  return it->second;
}

TEST(CudaExl3, DecodeGoldenBitExact) {
  LILY_REQUIRE_GPU();
  const std::string vectors = test::golden_file("exl3/vectors.safetensors");
  ASSERT_FALSE(vectors.empty()) << "exl3/vectors.safetensors not in any golden folder";
  SafeTensorsFile f(vectors);
  int cases = 0;
  for (int K = 1; K <= 8; ++K)
    for (int cb = 0; cb < 3; ++cb) {
      std::string p = "k";
      p += std::to_string(K);
      p += "_cb";
      p += std::to_string(cb);
      p += ".";
      const auto& tr = tensor(f, p + "trellis");
      const auto& what = tensor(f, p + "w_hat");
      const size_t nw = size_t(8 * 16 * 16 * K);
      const auto* tw = reinterpret_cast<const uint16_t*>(tr.data);
      Dev<uint16_t> dt(std::vector<uint16_t>(tw, tw + nw));
      Dev<uint16_t> dw(size_t(128 * 256));
      cuda::exl3_decode_tiles(dt.p, K, cb, 128, 256, dw.p, nullptr);
      auto got = dw.down();
      const auto* want = reinterpret_cast<const uint16_t*>(what.data);
      int bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
      EXPECT_EQ(bad, 0) << p;
      // the golden y = x · W (float64) through the GEMV (rows 1, 2) and the GEMM (3 rows)
      std::mt19937 rng(1);
      HostExl3 h(K, Exl3Codebook(cb), 128, 256, rng);
      h.trellis.assign(tw, tw + nw);
      const auto* su = reinterpret_cast<const uint16_t*>(tensor(f, p + "suh").data);
      const auto* sv = reinterpret_cast<const uint16_t*>(tensor(f, p + "svh").data);
      h.suh.assign(su, su + 128);
      h.svh.assign(sv, sv + 256);
      h.fix();
      DevExl3 d({&h}, 1);
      const auto* xs = reinterpret_cast<const float*>(tensor(f, p + "x").data);
      const auto* ys = reinterpret_cast<const float*>(tensor(f, p + "y").data);
      for (int T : {1, 2, 3}) {
        Dev<float> dx(std::vector<float>(xs, xs + 128 * T)), dy(size_t(256 * T));
        cuda::linear(d.m, 256, 128, dx.p, 128, T, dy.p, 256, false, nullptr);
        EXPECT_LT(rel_err(dy.down(), std::vector<double>(ys, ys + 256 * T)), 1e-5) << p << " T " << T;
      }
      ++cases;
    }
  EXPECT_EQ(cases, 24);
}

// linear() (GEMV up to KernelSwitches::gemv_rows rows, GEMM above) against the float64 reference, every K
// and codebook, in every prompt precision (kBf16: the GEMM's inputs rounded once to fp16, 2^-11 relative; kFp16
// the same after each row's power of two, so inputs of 3e4, which overflow fp16 after the Hadamard, still fit).
TEST(CudaExl3, LinearMatchesReference) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(3);
  for (cuda::GemmPrec prec : {cuda::GemmPrec::kSplit, cuda::GemmPrec::kBf16, cuda::GemmPrec::kFp16}) {
    SwitchesScope scope([=](cuda::KernelSwitches& k) { k.gemm_prec = prec; });
    const double tol = prec == cuda::GemmPrec::kSplit ? 2e-5 : 2e-3;
    for (int K = 2; K <= 8; ++K)
      for (int cb = 0; cb < 3; ++cb) {
        const int in = K % 2 ? 200 : 256, out = K % 3 ? 300 : 128;  // padded and unpadded widths
        HostExl3 h(K, Exl3Codebook(cb), in, out, rng, K == 5);
        DevExl3 d({&h}, 1);
        for (int T : kRows) {
          auto x = randn(size_t(T) * in, rng);
          if (prec == cuda::GemmPrec::kFp16)
            for (auto& v : x) v *= 3e4f;
          Dev<float> dx(x), dy(size_t(T) * out);
          dy.poison();
          cuda::linear(d.m, out, in, dx.p, in, T, dy.p, out, false, nullptr);
          const double e = rel_err(dy.down(), h.ref(x, T));
          EXPECT_LT(e, tol) << "K " << K << " cb " << cb << " T " << T
                            << (prec == cuda::GemmPrec::kSplit ? " split" : prec == cuda::GemmPrec::kBf16 ? " bf16" : " fp16");
        }
      }
  }
}

// Rows of every magnitude, 1e-4 to 1e7 (1e3 more every fifth row), in every precision, on each path linear()
// takes: the fp32 GEMV (T 5), the split multi-row product (exl3_rows: T 8, 32; its row scales from max |x| over
// the thread-block cluster) and the GEMM (T 65; row scales from the pre-pass). Unscaled, rows past ~6e3 overflow
// fp16 after suh and the Hadamard, and small rows lose the split mode's lo half to fp16's subnormals; each row is
// held to the tolerance of LinearMatchesReference relative to its own output.
TEST(CudaExl3, RowsOfEveryMagnitude) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(4);
  for (cuda::GemmPrec prec : {cuda::GemmPrec::kSplit, cuda::GemmPrec::kBf16, cuda::GemmPrec::kFp16}) {
    SwitchesScope scope([=](cuda::KernelSwitches& k) { k.gemm_prec = prec; });
    const double tol = prec == cuda::GemmPrec::kSplit ? 2e-5 : 2e-3;
    const char* name = prec == cuda::GemmPrec::kSplit ? "split" : prec == cuda::GemmPrec::kBf16 ? "bf16" : "fp16";
    for (auto [K, cb] : {std::pair{4, 1}, std::pair{2, 0}}) {
      const int in = 1024, out = 256;  // 8 chunks: exl3_rows splits them over a cluster
      HostExl3 h(K, Exl3Codebook(cb), in, out, rng);
      DevExl3 d({&h}, 1);
      for (int T : {5, 8, 32, 65}) {
        auto x = randn(size_t(T) * in, rng);
        for (int r = 0; r < T; ++r) {
          const float sc = std::pow(10.0f, float(r % 9 - 4)) * (r % 5 == 4 ? 1e3f : 1.0f);
          for (int k = 0; k < in; ++k) x[size_t(r) * in + k] *= sc;
        }
        Dev<float> dx(x), dy(size_t(T) * out);
        dy.poison();
        cuda::linear(d.m, out, in, dx.p, in, T, dy.p, out, false, nullptr);
        const auto y = dy.down();
        const auto want = h.ref(x, T);
        for (int r = 0; r < T; ++r) {
          const std::vector<float> yr(y.begin() + r * out, y.begin() + (r + 1) * out);
          const std::vector<double> wr(want.begin() + r * out, want.begin() + (r + 1) * out);
          EXPECT_LT(rel_err(yr, wr), tol) << name << " K " << K << " cb " << cb << " T " << T << " row " << r;
        }
      }
    }
  }
}

// Dense products of 3..32 rows (rows_min 3) with long inputs: the k chunks split over thread-block clusters
// (exl3_rows; 3 column blocks, 16 chunks), against the reference and, bit for bit, the first rows of 3.
TEST(CudaExl3, ClusterSplitRows) {
  LILY_REQUIRE_GPU();
  struct Scope {
    cuda::KernelSwitches saved = cuda::kernel_switches();
    Scope() {
      auto k = saved;
      k.rows_min = 3;
      k.rows_min_exl3 = 3;
      cuda::set_kernel_switches(k);
    }
    ~Scope() { cuda::set_kernel_switches(saved); }
  } scope;
  std::mt19937 rng(21);
  for (auto [K, cb] : {std::pair{4, 1}, std::pair{3, 2}, std::pair{2, 0}}) {
    const int in = 2048, out = 300;
    HostExl3 h(K, Exl3Codebook(cb), in, out, rng, true);
    DevExl3 d({&h}, 1);
    auto x = randn(size_t(32) * in, rng);
    std::vector<float> first;
    for (int T : {3, 5, 16, 32}) {
      std::vector<float> xt(x.begin(), x.begin() + std::ptrdiff_t(size_t(T) * in));
      Dev<float> dx(xt), dy(size_t(T) * out);
      dy.poison();
      cuda::linear(d.m, out, in, dx.p, in, T, dy.p, out, false, nullptr);
      auto y = dy.down();
      EXPECT_LT(rel_err(y, h.ref(xt, T)), 2e-5) << "K " << K << " cb " << cb << " T " << T;
      std::vector<float> two(y.begin(), y.begin() + 2 * out);
      if (first.empty()) first = two;
      EXPECT_EQ(two, first) << "K " << K << " cb " << cb << " T " << T << ": rows 0-1 depend on the other rows";
    }
  }
}

// Bias, a logical column map (out_rows), accumulate, strided x / y and a fused RMSNorm.
TEST(CudaExl3, RemapAccumulateNorm) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // fp32-class tolerances (both precisions: LinearMatchesReference)
  std::mt19937 rng(5);
  HostExl3 h(4, Exl3Codebook::Mul1, 384, 256, rng, true);
  h.w.out = 150;
  for (int j = 0; j < 150; ++j) h.out_rows.push_back(int32_t((j * 37 + 11) % 256));
  h.fix();
  DevExl3 d({&h}, 1);
  const int in = 384, out = 150, ldx = 400, ldy = 160;
  for (int T : kRows) {
    auto x = randn(size_t(T) * ldx, rng);
    auto y0 = randn(size_t(T) * ldy, rng);
    std::vector<float> xc(size_t(T) * in);
    for (int t = 0; t < T; ++t) std::copy_n(x.begin() + t * ldx, in, xc.begin() + t * in);
    auto r = h.ref(xc, T);
    Dev<float> dx(x), dy(y0);
    cuda::linear(d.m, out, in, dx.p, ldx, T, dy.p, ldy, true, nullptr);
    auto y = dy.down();
    std::vector<float> got(size_t(T) * out);
    std::vector<double> want(size_t(T) * out);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < out; ++j) {
        got[size_t(t * out + j)] = y[size_t(t * ldy + j)];
        want[size_t(t * out + j)] = r[size_t(t * out + j)] + y0[size_t(t * ldy + j)];
      }
    EXPECT_LT(rel_err(got, want), 2e-5) << "T " << T;
    for (int t = 0; t < T; ++t)
      for (int j = out; j < ldy; ++j) EXPECT_EQ(y[size_t(t * ldy + j)], y0[size_t(t * ldy + j)]) << "padding written";
  }
  // fused RMSNorm (GEMV rows only)
  for (int T : {1, 2}) {
    auto x = randn(size_t(T) * in, rng, 3.f);
    auto nw = randn(size_t(in), rng);
    std::vector<float> xn(x.size());
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int i = 0; i < in; ++i) ss += double(x[size_t(t * in + i)]) * x[size_t(t * in + i)];
      const double inv = 1.0 / std::sqrt(ss / in + 1e-6);
      for (int i = 0; i < in; ++i) xn[size_t(t * in + i)] = float(x[size_t(t * in + i)] * inv * nw[size_t(i)]);
    }
    Dev<float> dx(x), dn(nw), dy(size_t(T) * out);
    cuda::linear(d.m, out, in, dx.p, in, T, dy.p, out, false, nullptr, dn.p, 1e-6f);
    EXPECT_LT(rel_err(dy.down(), h.ref(xn, T)), 2e-5) << "norm T " << T;
  }
}

// Runs of several parts (q/k/v-like): the rows of the matrix are the parts' outputs in order.
TEST(CudaExl3, MultiPartRows) {
  LILY_REQUIRE_GPU();
  HighPrecisionScope high;  // fp32-class tolerances (both precisions: LinearMatchesReference)
  std::mt19937 rng(7);
  const int in = 130;
  HostExl3 a(3, Exl3Codebook::Mcg, in, 130, rng), b(3, Exl3Codebook::Mcg, in, 256, rng, true),
      c(3, Exl3Codebook::Mcg, in, 60, rng);
  DevExl3 d({&a, &b, &c}, 3);
  const int out = 130 + 256 + 60;
  for (int T : kRows) {
    auto x = randn(size_t(T) * in, rng);
    auto ra = a.ref(x, T), rb = b.ref(x, T), rc = c.ref(x, T);
    std::vector<double> want(size_t(T) * out);
    for (int t = 0; t < T; ++t) {
      std::copy_n(ra.begin() + t * 130, 130, want.begin() + t * out);
      std::copy_n(rb.begin() + t * 256, 256, want.begin() + t * out + 130);
      std::copy_n(rc.begin() + t * 60, 60, want.begin() + t * out + 386);
    }
    Dev<float> dx(x), dy(size_t(T) * out);
    dy.poison();
    cuda::linear(d.m, out, in, dx.p, in, T, dy.p, out, false, nullptr);
    EXPECT_LT(rel_err(dy.down(), want), 2e-5) << "T " << T;
  }
}

// Decode GEMVs whose grid is under ~2 blocks per SM split k (exl3_gemv_split) over a thread-block cluster
// or over independent blocks whose last adds the partial sums (exl3_gemv_fixup): long inputs (k-tile rows
// for 1 to 16 ranks), few column blocks, one to three rows, a fused RMSNorm, accumulate, several parts and a
// column map; MoE slots in swiglu mode and down. Each against the reference and against the unsplit kernel
// (the same products summed in another order); the fixup launches twice with bit-identical results (its
// counters are back at zero after each launch).
TEST(CudaExl3, SplitGemvMatchesUnsplit) {
  LILY_REQUIRE_GPU();
  std::mt19937 rng(31);
  struct Scratch {  // the fixup's scratch for the default stream the launches below use
    Scratch() { cuda::exl3_split_scratch_acquire(nullptr); }
    ~Scratch() { cuda::exl3_split_scratch_release(nullptr); }
  } scratch;
  const char* names[3] = {"unsplit", "cluster", "fixup"};
  auto set = [](int v) {
    return [v](cuda::KernelSwitches& k) {
      k.exl3_gemv_split = v ? 4 : 0;
      k.exl3_gemv_fixup = v == 2;
      k.exl3_fixup_min_in = 0;
    };
  };
  // results[variant]; the fixup variant's plan checked (split, as independent blocks) where `split` says so
  auto variants = [&](const std::function<std::vector<float>()>& run, const cuda::Mat& m, int slots, bool swiglu,
                      bool split, const std::string& what) {
    std::vector<std::vector<float>> r;
    for (int v = 0; v < 3; ++v) {
      SwitchesScope sw(set(v));
      r.push_back(run());
      if (v == 2) {
        const cuda::Exl3GemvSplit p = cuda::exl3_gemv_split_of(m, slots, swiglu, nullptr);
        if (split) {
          EXPECT_TRUE(p.ks > 1 && p.fixup) << what << ": ks " << p.ks << " fixup " << p.fixup;
        }
        EXPECT_EQ(run(), r.back()) << what << ": fixup launched again";
      }
    }
    return r;
  };
  auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
    return rel_err(a, std::vector<double>(b.begin(), b.end()));
  };
  // dense rows: in 256 (16 k-tile rows: no split), 512 (2 ranks), 2048 and 4096 (8 ranks); 1152 and 2176 end
  // in half a pair of 128-chunks (9 and 17 chunks: 2 and 8 ranks)
  for (auto [K, cb, in, out] : {std::tuple{4, 1, 2048, 300}, std::tuple{2, 0, 4096, 128}, std::tuple{3, 2, 512, 200},
                                std::tuple{4, 1, 256, 130}, std::tuple{5, 1, 2000, 260}, std::tuple{4, 1, 1152, 140},
                                std::tuple{6, 1, 2100, 200}}) {
    HostExl3 h(K, Exl3Codebook(cb), in, out, rng, true);
    DevExl3 d({&h}, 1);
    for (int T : {1, 2, 3}) {
      const std::string what = "K " + std::to_string(K) + " in " + std::to_string(in) + " out " + std::to_string(out) +
                               " T " + std::to_string(T);
      auto x = randn(size_t(T) * in, rng);
      auto y0 = randn(size_t(T) * out, rng);
      auto nw = randn(size_t(in), rng);
      const bool norm = T < 3, acc = T == 2;
      std::vector<float> xn = x;
      if (norm)
        for (int t = 0; t < T; ++t) {
          double ss = 0;
          for (int i = 0; i < in; ++i) ss += double(x[size_t(t * in + i)]) * x[size_t(t * in + i)];
          const double inv = 1.0 / std::sqrt(ss / in + 1e-6);
          for (int i = 0; i < in; ++i) xn[size_t(t * in + i)] = float(x[size_t(t * in + i)] * inv * nw[size_t(i)]);
        }
      auto want = h.ref(xn, T);
      if (acc)
        for (size_t i = 0; i < want.size(); ++i) want[i] += y0[i];
      auto r = variants([&] {
        Dev<float> dx(x), dn(nw), dy(y0);
        cuda::linear(d.m, out, in, dx.p, in, T, dy.p, out, acc, nullptr, norm ? dn.p : nullptr, 1e-6f);
        return dy.down();
      }, d.m, T, false, in > 256, what);
      for (int v = 0; v < 3; ++v) EXPECT_LT(rel_err(r[size_t(v)], want), 2e-5) << what << " " << names[v];
      for (int v = 1; v < 3; ++v) EXPECT_LT(close(r[size_t(v)], r[0]), 1e-5) << what << " " << names[v] << " vs unsplit";
    }
  }
  // several parts (5 column blocks) with a column map on the middle one
  {
    const int in = 1024;
    HostExl3 a(4, Exl3Codebook::Mcg, in, 130, rng), b(4, Exl3Codebook::Mcg, in, 200, rng, true),
        c(4, Exl3Codebook::Mcg, in, 60, rng);
    for (int j = 0; j < 200; ++j) b.out_rows.push_back(int32_t((j * 37 + 11) % 256));
    b.fix();
    DevExl3 d({&a, &b, &c}, 3);
    const int out = 130 + 200 + 60;
    auto x = randn(size_t(in), rng);
    auto ra = a.ref(x, 1), rb = b.ref(x, 1), rc = c.ref(x, 1);
    std::vector<double> want(ra);
    want.insert(want.end(), rb.begin(), rb.end());
    want.insert(want.end(), rc.begin(), rc.end());
    auto r = variants([&] {
      Dev<float> dx(x), dy(static_cast<size_t>(out));
      dy.poison();
      cuda::linear(d.m, out, in, dx.p, in, 1, dy.p, out, false, nullptr);
      return dy.down();
    }, d.m, 1, false, true, "parts");
    for (int v = 0; v < 3; ++v) EXPECT_LT(rel_err(r[size_t(v)], want), 2e-5) << "parts " << names[v];
    for (int v = 1; v < 3; ++v) EXPECT_LT(close(r[size_t(v)], r[0]), 1e-5) << "parts " << names[v] << " vs unsplit";
  }
  // MoE slots: gate‖up (2 column blocks of each part, 6 slots) with the norm, then down (in 512: 2 ranks)
  {
    const int E = 4, H = 2048, I = 512;
    std::vector<std::unique_ptr<HostExl3>> g, u, dn;
    for (int e = 0; e < E; ++e) {
      g.push_back(std::make_unique<HostExl3>(4, Exl3Codebook::Mcg, H, I, rng));
      u.push_back(std::make_unique<HostExl3>(4, Exl3Codebook::Mcg, H, I, rng));
      dn.push_back(std::make_unique<HostExl3>(4, Exl3Codebook::Mcg, I, H, rng));
    }
    std::vector<const HostExl3*> gu, dd;
    for (int e = 0; e < E; ++e) { gu.push_back(g[size_t(e)].get()); gu.push_back(u[size_t(e)].get()); dd.push_back(dn[size_t(e)].get()); }
    DevExl3 mgu(gu, 2), mdn(dd, 1);
    const std::vector<int32_t> ex = {3, 0, 2, 2, 1, 3};
    const int slots = int(ex.size());
    auto x = randn(size_t(2) * H, rng, 2.f);
    auto nw = randn(size_t(H), rng);
    std::vector<double> hw(size_t(slots) * I);
    for (int sl = 0; sl < slots; ++sl) {
      std::vector<float> xr(x.begin() + (sl / 3) * H, x.begin() + (sl / 3 + 1) * H);
      double ss = 0;
      for (float v : xr) ss += double(v) * v;
      const double inv = 1.0 / std::sqrt(ss / H + 1e-6);
      for (int i = 0; i < H; ++i) xr[size_t(i)] = float(xr[size_t(i)] * inv * nw[size_t(i)]);
      auto gr = g[size_t(ex[size_t(sl)])]->ref(xr, 1), ur = u[size_t(ex[size_t(sl)])]->ref(xr, 1);
      for (int r = 0; r < I; ++r) hw[size_t(sl * I + r)] = silu(gr[size_t(r)]) * ur[size_t(r)];
    }
    Dev<int32_t> dex(ex);
    auto hr = variants([&] {
      Dev<float> dx(x), dnw(nw), dh(size_t(slots) * I);
      dh.poison();
      cuda::gemv_slots(mgu.m, dex.p, 0, H, dx.p, H, 3, slots, dh.p, I, false, I, nullptr, dnw.p, 1e-6f);
      return dh.down();
    }, mgu.m, slots, true, true, "swiglu slots");
    for (int v = 0; v < 3; ++v) EXPECT_LT(rel_err(hr[size_t(v)], hw), 2e-5) << "swiglu slots " << names[v];
    for (int v = 1; v < 3; ++v) EXPECT_LT(close(hr[size_t(v)], hr[0]), 1e-5) << "swiglu slots " << names[v] << " vs unsplit";
    const std::vector<float>& hs = hr[2];
    std::vector<double> yw(size_t(slots) * H);
    for (int sl = 0; sl < slots; ++sl) {
      std::vector<float> hr(hs.begin() + sl * I, hs.begin() + (sl + 1) * I);
      auto yr = dn[size_t(ex[size_t(sl)])]->ref(hr, 1);
      std::copy(yr.begin(), yr.end(), yw.begin() + sl * H);
    }
    auto yr = variants([&] {
      Dev<float> dh(hs), dy(size_t(slots) * H);
      dy.poison();
      cuda::gemv_slots(mdn.m, dex.p, H, I, dh.p, I, 1, slots, dy.p, H, false, 0, nullptr);
      return dy.down();
    }, mdn.m, slots, false, true, "down slots");
    for (int v = 0; v < 3; ++v) EXPECT_LT(rel_err(yr[size_t(v)], yw), 2e-5) << "down slots " << names[v];
    for (int v = 1; v < 3; ++v) EXPECT_LT(close(yr[size_t(v)], yr[0]), 1e-5) << "down slots " << names[v] << " vs unsplit";
  }
}

// ---- whole models ------------------------------------------------------------------------------
std::vector<int32_t> golden_prompt(const std::string& dir) {
  std::ifstream jf(dir + "/golden.json");
  std::stringstream ss;
  ss << jf.rdbuf();
  return nlohmann::json::parse(ss.str())["prompt_ids"].get<std::vector<int32_t>>();
}

// The MoE golden and the dense Qwen3.5 golden.
TEST(CudaExl3, GoldenModelK4MatchesCpu) {
  LILY_REQUIRE_GPU();
  for (const std::string name : {"qwen3_5_moe_text-a", "qwen3_5_text-a-mtp"}) {
    const std::string dir = test::golden_dir(name);
    if (dir.empty()) GTEST_SKIP() << name << ": golden model not present";
    const fs::path out = fs::temp_directory_path() / ("lily-cuda-exl3-k4-" + name + "-" + std::to_string(::getpid()));
    fs::remove_all(out);
    QuantizeOptions qo;
    qo.model_dir = dir;
    qo.out_dir = out.string();
    qo.format = "exl3";
    qo.bits = 4;
    qo.head_bits = 4;
    qo.progress = false;
    quantize_model(qo);
    auto w = ModelWeights::load(out.string());
    compare_backends(w, golden_prompt(dir), (name + " exl3 K4").c_str());
    fs::remove_all(out);
  }
}

TEST(CudaExl3, TinySynthMatchesCpu) {
  LILY_REQUIRE_GPU();
  for (const std::string preset : {"tiny", "tiny-dense"})
  for (auto cb : {Exl3Codebook::Mcg, Exl3Codebook::Mul1}) {
    SynthOptions so;
    so.preset = preset;
    so.format = SynthFormat::Exl3;
    so.exl3_bits = 3;
    so.codebook = cb;
    auto w = synth_model(so);
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(w->cfg.vocab));
    compare_backends(w, prompt, (preset + (cb == Exl3Codebook::Mcg ? " synth exl3 K3 mcg" : " synth exl3 K3 mul1")).c_str());
  }
}

// Kernel times at the Qwen3.5-35B-A3B shapes (K = 4, MCG; the trellis contents do not change the work):
// the MoE decode GEMVs over 8 expert slots, a dense GEMV, and the prompt GEMM over a 512-token tile map.
TEST(CudaExl3, TimingPrint) {
  LILY_REQUIRE_GPU();
  const int K = 4, E = 256, H = 2048, I = 512, k = 8;
  auto stack = [&](int n, int in, int out, std::vector<std::unique_ptr<Dev<uint16_t>>>& keep) {
    std::vector<cuda::Exl3Part> h(static_cast<size_t>(n));
    const int in_p = (in + 127) / 128 * 128, out_p = (out + 127) / 128 * 128;
    keep.push_back(std::make_unique<Dev<uint16_t>>(size_t(n) * (size_t(in_p) * out_p * K / 16 + in_p + out_p)));
    LILY_CU(cudaMemset(keep.back()->p, 0x3a, keep.back()->n * 2));
    uint16_t* p = keep.back()->p;
    for (auto& q : h) {
      q.trellis = p; p += size_t(in_p) * out_p * K / 16;
      q.suh = p; p += in_p;
      q.svh = p; p += out_p;
      q.in_p = in_p; q.out_p = out_p; q.rows = out;
    }
    return h;
  };
  std::vector<std::unique_ptr<Dev<uint16_t>>> keep;
  auto mk = [&](std::vector<cuda::Exl3Part> h, int per_expert, std::unique_ptr<Dev<uint8_t>>& store) {
    for (size_t i = 0; i < h.size(); ++i) h[i].row0 = i % size_t(per_expert) ? h[i - 1].row0 + h[i - 1].rows : 0;
    std::vector<uint8_t> b(sizeof(cuda::Exl3Part) * h.size());
    std::memcpy(b.data(), h.data(), b.size());
    store = std::make_unique<Dev<uint8_t>>(b);
    cuda::Mat m;
    m.exl3 = true; m.parts = reinterpret_cast<const cuda::Exl3Part*>(store->p); m.nparts = per_expert; m.K = K; m.cb = 1;
    m.in_p = h[0].in_p;
    for (int p = 0; p < per_expert; ++p) m.col_blocks += h[size_t(p)].out_p / 128;
    return m;
  };
  std::unique_ptr<Dev<uint8_t>> s1, s2, s3, s4;
  auto gu = stack(2 * E, H, I, keep), dn = stack(E, I, H, keep), dense = stack(1, H, 8192, keep), head = stack(1, H, 248320, keep);
  cuda::Mat mgu = mk(gu, 2, s1), mdn = mk(dn, 1, s2), mde = mk(dense, 1, s3), mhe = mk(head, 1, s4);
  std::mt19937 rng(1);
  const int T = 512, n = T * k;
  auto x = randn(size_t(T) * H, rng);
  std::vector<int32_t> ex(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ex[size_t(i)] = int32_t((i * 37 + i / k * 11) % E);
  std::vector<int32_t> cnt(static_cast<size_t>(E)), tiles, gather;
  for (int e : ex) ++cnt[size_t(e)];
  int off = 0;
  for (int e = 0; e < E; ++e) {
    for (int r = 0; r < cnt[size_t(e)]; r += 64) tiles.insert(tiles.end(), {e, off + r, std::min(64, cnt[size_t(e)] - r)});
    off += cnt[size_t(e)];
  }
  for (int i = 0; i < n; ++i) gather.push_back(int32_t(i % T));
  const int nt = int(tiles.size() / 3);
  Dev<float> dx(x), dh(size_t(n) * 2 * I), dy(size_t(n) * 248320 / 32 + size_t(n) * H);
  Dev<int32_t> dex(ex), dtiles(tiles), dnt(std::vector<int32_t>{nt}), dg(gather);
  cudaEvent_t a, b;
  LILY_CU(cudaEventCreate(&a));
  LILY_CU(cudaEventCreate(&b));
  auto time = [&](const char* what, double weights, auto&& f) {
    for (int i = 0; i < 3; ++i) f();
    const int reps = 20;
    LILY_CU(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) f();
    LILY_CU(cudaEventRecord(b));
    LILY_CU(cudaEventSynchronize(b));
    float ms = 0;
    LILY_CU(cudaEventElapsedTime(&ms, a, b));
    const double us = 1e3 * ms / reps;
    std::printf("[exl3 timing] %-44s %9.1f us  %7.1f GB/s trellis  %6.2f Tweights/s\n", what, us,
                weights * K / 8 / (us * 1e3), weights / (us * 1e6));
  };
  time("decode gate+up swiglu, 8 slots (2048->2x512)", 8.0 * 2 * H * I,
       [&] { cuda::gemv_slots(mgu, dex.p, 0, H, dx.p, H, k, k, dh.p, I, false, I, nullptr); });
  time("decode down, 8 slots (512->2048)", 8.0 * H * I,
       [&] { cuda::gemv_slots(mdn, dex.p, H, I, dh.p, I, 1, k, dy.p, H, false, 0, nullptr); });
  time("decode dense 2048->8192, 1 row", 2048.0 * 8192,
       [&] { cuda::linear(mde, 8192, H, dx.p, H, 1, dy.p, 8192, false, nullptr); });
  time("decode lm_head 2048->248320, 1 row", 2048.0 * 248320,
       [&] { cuda::linear(mhe, 248320, H, dx.p, H, 1, dy.p, 248320, false, nullptr); });
  time("prompt gate+up GEMM, 512 tok x top-8 tiles", double(E) * 2 * H * I,
       [&] { cuda::gemm_tiles(mgu, 2 * I, H, dx.p, H, dg.p, dh.p, 2 * I, false, dtiles.p, dnt.p, nt, n, nullptr); });
  time("prompt dense GEMM 512 rows 2048->8192", 2048.0 * 8192,
       [&] { cuda::linear(mde, 8192, H, dx.p, H, T, dy.p, 8192, false, nullptr); });
  LILY_CU(cudaDeviceSynchronize());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

}  // namespace
#endif
