// The int8-activation affine kernels (backend/cpu/affine_int8.h):
//  - every compiled ISA kernel against the scalar kernel (same quantised activations and integer sums,
//    so only float summation order differs) at awkward shapes, bits 4/8, groups 32/64/128;
//  - every kernel against the exact float product within the activation-rounding bound
//    Σ|s·code|·d/2 (affine_int8_error_bound), so the only error is the one the format of the
//    activations explains;
//  - path selection (AffinePath) and the golden model quantized to affine 4-bit: int8 vs exact logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cpu/affine_int8.h"
#include "backend/cpu/affine_int8_internal.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_observer.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "model/linear.h"
#include "model/qwen_hybrid.h"
#include "model/weights.h"
#include "quant/affine/affine.h"
#include "tools/eval.h"
#include "tools/quantize.h"
#include "../model/test_util.h"

namespace fs = std::filesystem;
using namespace lily;
using namespace lily::quant;

namespace {

using lily::test::randn;

std::vector<cpu::Int8Isa> isas() {
  std::vector<cpu::Int8Isa> v;
  for (auto i : {cpu::Int8Isa::Scalar, cpu::Int8Isa::Avx2, cpu::Int8Isa::AvxVnni, cpu::Int8Isa::Avx512Vnni})
    if (cpu::int8_isa_available(i)) v.push_back(i);
  return v;
}

// Every kernel this CPU runs: each ISA's row kernels, and its tiles where it has them.
struct Kernel {
  cpu::Int8Isa isa;
  cpu::Int8Tiling tiling;
  std::string name() const {
    return std::string(cpu::int8_isa_name(isa)) + (tiling == cpu::Int8Tiling::Tiles ? " tiles" : " rows");
  }
};
std::vector<Kernel> kernels() {
  std::vector<Kernel> v;
  for (auto i : isas()) {
    v.push_back({i, cpu::Int8Tiling::Rows});
    if (cpu::int8_tiles_available(i)) v.push_back({i, cpu::Int8Tiling::Tiles});
  }
  return v;
}

// Σ_i |W_oi · x_ti| per output: the scale of float summation-order differences.
std::vector<double> abs_products(const AffineWeight& w, const float* x, int64_t T) {
  std::vector<double> a(size_t(T * w.out));
  std::vector<float> row(size_t(w.in));
  for (int64_t o = 0; o < w.out; ++o) {
    affine_dequant_row_ref(w, o, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double s = 0;
      for (int64_t i = 0; i < w.in; ++i) s += std::fabs(double(row[size_t(i)]) * x[t * w.in + i]);
      a[size_t(t * w.out + o)] = s;
    }
  }
  return a;
}

Linear affine_linear(const AffineQuantized& q) {
  Linear l;
  l.name = "affine";
  l.out = q.out;
  l.in = q.in;
  l.format = WeightFormat::Affine;
  l.affine = std::make_shared<AffineWeight>(q.view());
  return l;
}

}  // namespace

// Batched products equal separate calls bit for bit, for every kernel: jobs sharing an input (one
// quantisation), different shapes, bit widths and groups in one pass, an empty job, and matmul_batch with
// a bf16 job mixed in.
TEST(AffineInt8, BatchEqualsSeparateCalls) {
  std::mt19937 rng(29);
  struct J { int64_t out, in; int bits, g; int64_t T; int x; };  // x: which input (jobs with equal x share it)
  const J js[] = {{65, 256, 4, 64, 3, 0}, {17, 256, 4, 64, 3, 0}, {129, 128, 8, 32, 2, 1}, {3, 256, 4, 128, 3, 0},
                  {64, 96, 4, 32, 1, 2}, {5, 256, 4, 64, 0, 0}};
  std::vector<AffineQuantized> qs;
  std::vector<Linear> ls;
  for (const J& j : js) {
    auto wf = randn(size_t(j.out * j.in), rng, 0.05f);
    qs.push_back(affine_quantize(wf.data(), j.out, j.in, j.bits, j.g, DType::BF16));
  }
  for (const auto& q : qs) ls.push_back(affine_linear(q));
  std::vector<std::vector<float>> xs = {randn(3 * 256, rng), randn(2 * 128, rng), randn(96, rng)};
  for (const Kernel& kn : kernels()) {
    const auto isa = kn.isa;
    std::vector<std::vector<float>> sep, bat;
    std::vector<cpu::Int8Job> jobs;
    std::vector<AffineWeight> ws;
    for (const auto& q : qs) ws.push_back(q.view());
    for (size_t k = 0; k < std::size(js); ++k) {
      const J& j = js[k];
      sep.emplace_back(size_t(std::max<int64_t>(1, j.T * j.out)), -1.0f);
      bat.emplace_back(size_t(std::max<int64_t>(1, j.T * j.out)), -2.0f);
      if (j.T > 0) cpu::affine_matmul_int8(ws[k], xs[size_t(j.x)].data(), j.T, sep.back().data(), isa, kn.tiling);
      else sep.back()[0] = -2.0f;  // an empty job writes nothing
      jobs.push_back({&ws[k], xs[size_t(j.x)].data(), j.T, bat.back().data()});
    }
    cpu::affine_matmul_int8_batch(jobs, isa, kn.tiling);
    for (size_t k = 0; k < std::size(js); ++k) EXPECT_EQ(bat[k], sep[k]) << kn.name() << " job " << k;
  }
  // matmul_batch: affine jobs batched, a bf16 job run on its own, same results as matmul
  std::vector<uint16_t> wb(size_t(7 * 256));
  for (auto& v : wb) v = f32_to_bf16(std::normal_distribution<float>(0.0f, 0.05f)(rng));
  Linear dense;
  dense.name = "dense";
  dense.out = 7;
  dense.in = 256;
  dense.dense = DenseWeight{DType::BF16, wb.data(), 256};
  std::vector<float> a0(3 * 65), a1(3 * 7), b0(a0.size()), b1(a1.size());
  cpu::matmul(ls[0], xs[0].data(), 3, a0.data(), cpu::AffinePath::Int8);
  cpu::matmul(dense, xs[0].data(), 3, a1.data(), cpu::AffinePath::Int8);
  const cpu::MatJob mj[] = {{&ls[0], xs[0].data(), 3, b0.data()}, {&dense, xs[0].data(), 3, b1.data()}};
  cpu::matmul_batch(mj, cpu::AffinePath::Int8);
  EXPECT_EQ(a0, b0);
  EXPECT_EQ(a1, b1);
}

TEST(AffineInt8, KernelsMatchScalarAndExactWithinBound) {
  std::mt19937 rng(17);
  struct Shape { int64_t out, in; };
  // out: not multiples of the 4- or 2-row blocks; in: full 128-code steps plus 32/64/96 tails, and whole
  // 512-input spans (the 4-bit gemv's fast path) alone or with a 128/32-input tail.
  // (rows: the 4-, 2- and 16-row blocks and their remainders; tokens: the tiles' 12 and remainders)
  const Shape shapes[] = {{1, 64}, {2, 96}, {3, 128}, {16, 288}, {17, 160}, {63, 224}, {64, 352}, {65, 1056},
                          {129, 4096}, {40, 512}, {19, 640}, {33, 1536}, {18, 2080}};
  const auto kns = kernels();
  std::printf("int8 kernels on this CPU:");
  for (const auto& kn : kns) std::printf(" %s,", kn.name().c_str());
  std::printf("\n");
  int checked = 0;
  for (const auto& s : shapes)
    for (int bits : {4, 8})
      for (int g : {32, 64, 128}) {
        if (s.in % g) continue;
        auto wf = randn(size_t(s.out * s.in), rng, 0.05f);
        // rows of different magnitudes, and one block of activations all zero (d = 0)
        for (int64_t o = 0; o < s.out; ++o)
          for (int64_t i = 0; i < s.in; ++i) wf[size_t(o * s.in + i)] *= float(1 + o % 3);
        auto q = affine_quantize(wf.data(), s.out, s.in, bits, g, g == 128 ? DType::F16 : DType::BF16);
        auto w = q.view();
        const Linear l = affine_linear(q);
        for (int64_t T : {1, 2, 3, 4, 7, 12, 13, 17, 25, 64}) {
          if (s.in >= 1024 && T > 4 && T != 13) continue;
          auto x = randn(size_t(T * s.in), rng);
          for (int64_t i = 0; i < 32; ++i) x[size_t(i)] = 0.0f;
          x[size_t(T * s.in - 1)] = 40.0f;  // an outlier in the last block
          const size_t n = size_t(T * s.out);
          std::vector<float> ys(n), yx(n), bound(n), y(n);
          cpu::affine_matmul_int8(w, x.data(), T, ys.data(), cpu::Int8Isa::Scalar);
          cpu::matmul_quantized_ref(l, x.data(), T, yx.data());
          cpu::affine_int8_error_bound(w, x.data(), T, bound.data());
          const auto mag = abs_products(w, x.data(), T);
          for (const auto& kn : kns) {
            cpu::affine_matmul_int8(w, x.data(), T, y.data(), kn.isa, kn.tiling);
            for (size_t i = 0; i < n; ++i) {
              const double fp = 2e-6 * mag[i] + 1e-6;  // float summation order
              ASSERT_NEAR(y[i], ys[i], fp) << kn.name() << " " << bits << "-bit g" << g << " " << s.out << "x"
                                           << s.in << " T" << T << " at " << i;
              ASSERT_LE(std::fabs(double(y[i]) - yx[i]), 1.001 * bound[i] + 2 * fp)
                  << kn.name() << " " << bits << "-bit g" << g << " " << s.out << "x" << s.in << " T" << T
                  << " at " << i << " vs exact";
            }
            ++checked;
          }
        }
      }
  EXPECT_GT(checked, 100);
}

// A token's outputs do not depend on the tokens it runs with: row t of a T-token product equals that token's
// one-token product bit for bit, for every kernel; each ISA's row and tile forms agree bit for bit.
TEST(AffineInt8, RowsDoNotDependOnTheBatch) {
  std::mt19937 rng(23);
  struct Shape { int64_t out, in; };
  const Shape shapes[] = {{1, 64}, {3, 96}, {17, 160}, {65, 224}, {16, 1056}, {33, 4096}};
  const auto kns = kernels();
  for (const auto& s : shapes)
    for (int bits : {4, 8})
      for (int g : {32, 64, 128}) {
        if (s.in % g) continue;
        auto wf = randn(size_t(s.out * s.in), rng, 0.05f);
        auto q = affine_quantize(wf.data(), s.out, s.in, bits, g);
        auto w = q.view();
        for (int64_t T : {1, 2, 3, 4, 5, 12, 13, 17, 33}) {
          if (s.in >= 4096 && T > 13) continue;
          auto x = randn(size_t(T * s.in), rng);
          std::vector<float> y(size_t(T * s.out)), one(size_t(s.out)), first;
          for (const auto& kn : kns) {
            cpu::affine_matmul_int8(w, x.data(), T, y.data(), kn.isa, kn.tiling);
            for (int64_t t = 0; t < T; ++t) {
              cpu::affine_matmul_int8(w, x.data() + t * s.in, 1, one.data(), kn.isa, kn.tiling);
              ASSERT_EQ(0, std::memcmp(one.data(), y.data() + t * s.out, one.size() * 4))
                  << kn.name() << " " << bits << "-bit g" << g << " " << s.out << "x" << s.in << " T" << T << " row " << t;
            }
            if (kn.tiling == cpu::Int8Tiling::Rows) first = y;  // kernels(): an ISA's rows, then its tiles
            else ASSERT_EQ(first, y) << kn.name() << " vs rows " << bits << "-bit g" << g << " " << s.out << "x" << s.in << " T" << T;
          }
        }
      }
}

// Tiles against the same ISA's rows (bit for bit) and the scalar kernel at awkward sizes: token counts around
// the tiles' passes, row counts off the 8- and 16-row tiles, inputs of one block, of a lone last block and
// past a 1024-input span; Auto equals both forms.
TEST(AffineInt8, TilesMatchRowsAtAwkwardSizes) {
  std::mt19937 rng(31);
  struct Shape { int64_t out, in; };
  const Shape shapes[] = {{1, 32}, {7, 64}, {9, 96}, {13, 160}, {23, 1056}};
  int checked = 0;
  for (const auto isa : isas()) {
    if (!cpu::int8_tiles_available(isa)) continue;
    for (const auto& s : shapes)
      for (int bits : {4, 8})
        for (int g : {32, 64, 128}) {
          if (s.in % g) continue;
          auto wf = randn(size_t(s.out * s.in), rng, 0.05f);
          auto q = affine_quantize(wf.data(), s.out, s.in, bits, g, g == 64 ? DType::F16 : DType::BF16);
          auto w = q.view();
          for (int64_t T : {1, 2, 3, 5, 16, 17, 63, 64, 65, 129}) {
            if (s.in > 1024 && T > 65) continue;
            auto x = randn(size_t(T * s.in), rng);
            const size_t n = size_t(T * s.out);
            std::vector<float> yr(n), yt(n), ya(n), ys(n);
            cpu::affine_matmul_int8(w, x.data(), T, yr.data(), isa, cpu::Int8Tiling::Rows);
            cpu::affine_matmul_int8(w, x.data(), T, yt.data(), isa, cpu::Int8Tiling::Tiles);
            cpu::affine_matmul_int8(w, x.data(), T, ya.data(), isa, cpu::Int8Tiling::Auto);
            cpu::affine_matmul_int8(w, x.data(), T, ys.data(), cpu::Int8Isa::Scalar);
            const std::string what = std::string(cpu::int8_isa_name(isa)) + " " + std::to_string(bits) + "-bit g" +
                                     std::to_string(g) + " " + std::to_string(s.out) + "x" + std::to_string(s.in) +
                                     " T" + std::to_string(T);
            ASSERT_EQ(0, std::memcmp(yr.data(), yt.data(), n * 4)) << what << " rows vs tiles";
            ASSERT_EQ(0, std::memcmp(yr.data(), ya.data(), n * 4)) << what << " rows vs auto";
            const auto mag = abs_products(w, x.data(), T);
            for (size_t i = 0; i < n; ++i) ASSERT_NEAR(yt[i], ys[i], 2e-6 * mag[i] + 1e-6) << what << " at " << i;
            ++checked;
          }
        }
  }
  if (checked == 0) GTEST_SKIP() << "no tile kernel on this CPU";
  EXPECT_GT(checked, 100);
}

TEST(AffineInt8, SimdQuantiserMatchesPlain) {
  if (!cpu::int8_isa_available(cpu::Int8Isa::Avx2)) GTEST_SKIP() << "no SIMD quantiser (AVX2 or AVX-512 VNNI)";
  std::mt19937 rng(3);
  for (int64_t in : {32, 64, 96, 160, 224, 352, 1056})
    for (int bits : {4, 8})
      for (int g : {32, 64, 128}) {
        if (in % g) continue;
        auto x = randn(size_t(in), rng);
        for (int64_t i = 0; i < 32; ++i) x[size_t(i)] = 0.0f;  // an all-zero block
        x[size_t(in - 1)] = -50.0f;
        x[size_t(in / 2)] = -0.0f;
        const size_t nd = size_t(in / 32 * (bits == 4 ? 4 : 8)), ng = size_t(in / g);
        std::vector<int8_t> q0(static_cast<size_t>(in)), q1(static_cast<size_t>(in));
        std::vector<float> d0(nd), d1(nd), s0(ng), s1(ng);
        cpu::affine_int8_quantize_row(x.data(), in, bits, g, false, q0.data(), d0.data(), s0.data());
        cpu::affine_int8_quantize_row(x.data(), in, bits, g, true, q1.data(), d1.data(), s1.data());
        EXPECT_EQ(q0, q1) << in << " " << bits << "-bit g" << g;
        EXPECT_EQ(d0, d1) << in << " " << bits << "-bit g" << g;
        for (size_t i = 0; i < ng; ++i) EXPECT_NEAR(s0[i], s1[i], 1e-5f * g) << in << " g" << g;
      }
}

// The AVX-512 tile build (16-row dword transposes) against the plain loop, byte for byte: row blocks
// cut by out (1, 2, 3, 16, 17, 63, 64, 65, 129 rows; the last block partial), in with 128-, 64- and
// 32-code tails.
TEST(AffineInt8, TileBuildMatchesPlain) {
  if (!cpu::int8_tiles_available(cpu::Int8Isa::Avx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI";
  std::mt19937 rng(41);
  int checked = 0;
  for (int64_t out : {1, 2, 3, 16, 17, 63, 64, 65, 129})
    for (int64_t in : {32, 64, 96, 160, 224, 352, 1056})
      for (int bits : {4, 8}) {
        auto wf = randn(size_t(out * in), rng, 0.05f);
        auto q = affine_quantize(wf.data(), out, in, bits, 32);
        auto w = q.view();
        std::vector<uint8_t> a(size_t(in * 16)), b(size_t(in * 16));
        for (int64_t o0 = 0; o0 < out; o0 += 16) {
          std::fill(b.begin(), b.end(), uint8_t(0xAB));  // the build writes every byte
          cpu::int8_detail::tile_build(w, o0, false, a.data());
          cpu::int8_detail::tile_build(w, o0, true, b.data());
          ASSERT_EQ(a, b) << bits << "-bit " << out << "x" << in << " rows from " << o0;
          ++checked;
        }
      }
  EXPECT_GT(checked, 100);
}

TEST(AffineInt8, ParamsTransposeMatchesPlain) {
  if (!cpu::int8_tiles_available(cpu::Int8Isa::Avx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI";
  std::mt19937 rng(43);
  int checked = 0;
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int64_t out : {1, 15, 16, 17, 40})
      for (int64_t in : {32, 64, 512, 544, 1024, 1056}) {
        auto wf = randn(size_t(out * in), rng, 0.05f);
        auto q = affine_quantize(wf.data(), out, in, 4, 32, dt == DType::F32 ? DType::BF16 : dt);
        auto w = q.view();
        std::vector<float> fs, fb;  // F32 scales: the bf16 ones widened (the quantiser writes 16-bit ones)
        if (dt == DType::F32) {
          for (int64_t i = 0; i < out * w.groups(); ++i) {
            fs.push_back(quant::affine_scale(w, i / w.groups(), i % w.groups()));
            fb.push_back(quant::affine_bias(w, i / w.groups(), i % w.groups()));
          }
          w.scale_dtype = DType::F32;
          w.scales = fs.data();
          w.biases = fb.data();
        }
        const size_t n = size_t(w.groups() * 16);
        std::vector<float> s0(n), b0(n), s1(n, -1.0f), b1(n, -1.0f);  // both write every float
        for (int64_t o0 = 0; o0 < out; o0 += 16) {
          cpu::int8_detail::params_transposed(w, o0, false, s0.data(), b0.data());
          cpu::int8_detail::params_transposed(w, o0, true, s1.data(), b1.data());
          ASSERT_EQ(0, std::memcmp(s0.data(), s1.data(), n * 4)) << dtype_name(dt) << " " << out << "x" << in << " from " << o0;
          ASSERT_EQ(0, std::memcmp(b0.data(), b1.data(), n * 4)) << dtype_name(dt) << " " << out << "x" << in << " from " << o0;
          ++checked;
        }
      }
  EXPECT_GT(checked, 50);
}

TEST(AffineInt8, PathSelection) {
  std::mt19937 rng(5);
  const int64_t out = 37, in = 192, T = 5;
  auto wf = randn(size_t(out * in), rng, 0.1f);
  auto x = randn(size_t(T * in), rng);
  for (int bits : {3, 4, 8}) {
    auto q = affine_quantize(wf.data(), out, in, bits, 64);
    const Linear l = affine_linear(q);
    std::vector<float> yi(size_t(T * out)), ye(size_t(T * out)), yr(size_t(T * out)), yk(size_t(T * out));
    cpu::matmul(l, x.data(), T, yi.data(), cpu::AffinePath::Int8);
    cpu::matmul(l, x.data(), T, ye.data(), cpu::AffinePath::Exact);
    cpu::matmul_quantized_ref(l, x.data(), T, yr.data());
    for (size_t i = 0; i < yr.size(); ++i) EXPECT_NEAR(ye[i], yr[i], 1e-4f * (1 + std::fabs(yr[i])));
    if (bits == 3) {  // no int8 kernel for 3-bit: the exact path serves both
      EXPECT_FALSE(cpu::affine_int8_supported(q.view()));
      EXPECT_EQ(yi, ye);
    } else {
      EXPECT_TRUE(cpu::affine_int8_supported(q.view()));
      cpu::affine_matmul_int8(q.view(), x.data(), T, yk.data());
      EXPECT_EQ(yi, yk);
      EXPECT_NE(yi, ye);  // the int8 path really ran
    }
  }
}

namespace {

double rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s / double(a.size()));
}

// A golden qwen3.5-MoE model quantized to affine 4-bit g64, teacher-forced over its prompt (one prefill
// step; then again with the last rows decoded one token at a time): logits of the int8 path against the
// exact path, beside the exact path against the float model (the 4-bit weights' own error).
void golden_int8_vs_exact(const std::string& model, const std::string& dir, bool probe_products, bool with_decode,
                          double max_rel, double max_kl_ratio) {
  auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
  const auto ids = j["prompt_ids"].get<std::vector<int32_t>>();
  const auto out = fs::temp_directory_path() / ("lily_test_int8_" + model + "_" + std::to_string(::getpid()));
  fs::remove_all(out);
  QuantizeOptions qo;
  qo.model_dir = dir;
  qo.out_dir = out.string();
  qo.format = "affine";
  qo.bits = 4;
  qo.group_size = 64;
  qo.progress = false;
  quantize_model(qo);
  auto wq = ModelWeights::load(out.string());
  auto wf = ModelWeights::load(dir);
  const int64_t T = int64_t(ids.size()), V = wq->cfg.vocab, D = 24;
  auto run = [&](std::shared_ptr<const ModelWeights> w, cpu::AffinePath p, bool decode) {
    cpu::CpuOptions o;
    o.affine = p;
    cpu::CpuBackend be(w, o);
    auto st = be.new_state(T);
    std::vector<float> lg(size_t(T * V));
    if (!decode) {
      forward_step(be, *st, ids, T, lg.data());
    } else {
      forward_step(be, *st, std::span<const int32_t>(ids.data(), size_t(T - D)), T - D, lg.data());
      for (int64_t t = T - D; t < T; ++t)
        forward_step(be, *st, std::span<const int32_t>(ids.data() + t, 1), 1, lg.data() + t * V);
    }
    return lg;
  };
  const auto ref = run(wf, cpu::AffinePath::Exact, false);
  // Every int8 product of the model's own activations against the exact product of the same inputs.
  struct Probe {
    int products = 0, over_bound = 0;
    double worst_rel = 0, sum_rel = 0;
  } probe;
  if (probe_products) {
  cpu::set_matmul_observer(
      [](void* ctx, const Linear& W, const float* x, int64_t T) {
        if (W.format != WeightFormat::Affine || !cpu::affine_int8_supported(*W.affine)) return;
        auto& p = *static_cast<Probe*>(ctx);
        const size_t n = size_t(T * W.out);
        std::vector<float> yi(n), ye(n), bound(n);
        cpu::affine_matmul_int8(*W.affine, x, T, yi.data());
        cpu::matmul_quantized_ref(W, x, T, ye.data());
        cpu::affine_int8_error_bound(*W.affine, x, T, bound.data());
        double d = 0, r = 0;
        for (size_t i = 0; i < n; ++i) {
          d += double(yi[i] - ye[i]) * (yi[i] - ye[i]);
          r += double(ye[i]) * ye[i];
          if (std::fabs(double(yi[i]) - ye[i]) > 1.001 * bound[i] + 1e-5 * (1 + std::fabs(ye[i]))) ++p.over_bound;
        }
        const double rel = r > 0 ? std::sqrt(d / r) : 0;
        p.worst_rel = std::max(p.worst_rel, rel);
        p.sum_rel += rel;
        ++p.products;
      },
      &probe);
  run(wq, cpu::AffinePath::Int8, false);
  cpu::set_matmul_observer(nullptr, nullptr);
  std::printf("%s: %d affine products on the model's activations, int8 vs exact relative RMS error mean %.4f "
              "worst %.4f\n", model.c_str(), probe.products, probe.sum_rel / std::max(1, probe.products),
              probe.worst_rel);
  EXPECT_GT(probe.products, 0);
  EXPECT_EQ(probe.over_bound, 0);
  }
  for (bool decode : {false, true}) {
    if (decode && !with_decode) continue;
    const auto ex = run(wq, cpu::AffinePath::Exact, decode);
    const auto i8 = run(wq, cpu::AffinePath::Int8, decode);
    EvalAccumulator q_vs_f, i_vs_e;
    q_vs_f.add(ex.data(), ref.data(), T - 1, V, ids.data() + 1);
    i_vs_e.add(i8.data(), ex.data(), T - 1, V, ids.data() + 1);
    const auto a = q_vs_f.result(), b = i_vs_e.result();
    const double e_w = rms_diff(ex, ref), e_a = rms_diff(i8, ex);
    std::printf("%s affine4 g64 %-16s exact vs float: KL %.5f top1 %.3f rms %.4f | int8 vs exact: KL %.5f "
                "top1 %.3f rms %.4f (%.3f of the weights' own)\n",
                model.c_str(), decode ? "prefill+decode:" : "prefill:", a.kl_mean, a.top1_agreement, e_w,
                b.kl_mean, b.top1_agreement, e_a, e_a / e_w);
    EXPECT_LT(e_a, max_rel * e_w) << model << (decode ? " decode" : " prefill");
    EXPECT_LT(b.kl_mean, max_kl_ratio * a.kl_mean) << model << (decode ? " decode" : " prefill");
  }
  fs::remove_all(out);
}

}  // namespace

TEST(AffineInt8, GoldenModelInt8VsExact) {
  const std::string dir = std::string(LILY_TEST_DATA) + "/golden/qwen3_5_moe_text-a";
  if (!fs::exists(fs::path(dir) / "model.safetensors")) GTEST_SKIP() << dir << " not present";
  golden_int8_vs_exact("qwen3_5_moe_text-a", dir, true, true, 0.6, 0.3);
}

TEST(AffineInt8, GoldenRealDimsInt8VsExact) {
  const auto dir = fs::path(LILY_SOURCE_DIR) / ".." / "shared" / "golden" / "qwen3_5_moe_text-r";
  if (!fs::exists(dir / "model.safetensors")) GTEST_SKIP() << dir << " not present (shared folder)";
  golden_int8_vs_exact("qwen3_5_moe_text-r", dir.string(), false, false, 0.45, 0.15);
}
