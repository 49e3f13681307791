// Threaded CPU kernels on quantized weights against their plain references at awkward sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/matmul.h"
#include "core/half.h"
#include "model/linear.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"
#include "../model/test_util.h"

using namespace lily;
using namespace lily::quant;

namespace {

using lily::test::randn;

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    n += double(a[i] - b[i]) * (a[i] - b[i]);
    d += double(b[i]) * b[i];
  }
  return d > 0 ? std::sqrt(n / d) : std::sqrt(n);
}

struct Exl3Fixture {
  std::vector<uint16_t> trellis, suh, svh, bias;
  std::vector<int32_t> rows;
  Exl3Weight w;
};

Exl3Fixture random_exl3(int64_t in, int64_t out, int K, Exl3Codebook cb, bool with_bias, std::mt19937& rng) {
  Exl3Fixture f;
  const int64_t kp = (in + 127) / 128 * 128, np = (out + 127) / 128 * 128;
  f.trellis.resize(size_t(kp / 16 * np / 16 * 16 * K));
  for (auto& v : f.trellis) v = uint16_t(rng());
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (int64_t i = 0; i < kp; ++i) f.suh.push_back(f32_to_f16((rng() & 1 ? -1 : 1) * u(rng) * 0.05f));
  for (int64_t i = 0; i < np; ++i) f.svh.push_back(f32_to_f16((rng() & 1 ? -1 : 1) * u(rng)));
  if (with_bias)
    for (int64_t i = 0; i < np; ++i) f.bias.push_back(f32_to_f16(u(rng) - 1.0f));
  f.w.K = K;
  f.w.codebook = cb;
  f.w.in = in;
  f.w.out = out;
  f.w.in_p = kp;
  f.w.out_p = np;
  f.w.trellis = f.trellis.data();
  f.w.suh = f.suh.data();
  f.w.svh = f.svh.data();
  f.w.bias = with_bias ? f.bias.data() : nullptr;
  return f;
}

Linear exl3_linear(const Exl3Weight& w) {
  Linear l;
  l.name = "exl3";
  l.out = w.out;
  l.in = w.in;
  l.format = WeightFormat::Exl3;
  l.exl3 = std::make_shared<Exl3Weight>(w);
  return l;
}

}  // namespace

TEST(QuantKernels, AffineMatchesReference) {
  std::mt19937 rng(5);
  const int64_t outs[] = {1, 2, 3, 17, 65};
  const int64_t ins[] = {32, 64, 96, 160};
  const int64_t Ts[] = {1, 2, 3, 17};
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int64_t out : outs)
      for (int64_t in : ins)
        for (int g : {32, 64, 128}) {
          if (in % g) continue;
          auto w = randn(size_t(out * in), rng, 0.1f);
          auto q = affine_quantize(w.data(), out, in, bits, g, (bits & 1) ? DType::F16 : DType::BF16);
          Linear l;
          l.name = "affine";
          l.out = out;
          l.in = in;
          l.format = WeightFormat::Affine;
          l.affine = std::make_shared<AffineWeight>(q.view());
          for (int64_t T : Ts) {
            auto x = randn(size_t(T * in), rng);
            std::vector<float> y(static_cast<size_t>(T * out)), yr(static_cast<size_t>(T * out));
            // the exact (float activation) kernels; the int8 path has its own test (test_affine_int8.cpp)
            cpu::matmul_quantized(l, x.data(), T, y.data(), cpu::AffinePath::Exact);
            cpu::matmul_quantized_ref(l, x.data(), T, yr.data());
            ASSERT_LT(rel_rms(y, yr), 1e-5) << bits << " " << out << "x" << in << " g" << g << " T" << T;
          }
          std::vector<float> row(static_cast<size_t>(in)), ref(static_cast<size_t>(in));
          cpu::weight_row_quantized(l, out - 1, row.data());
          affine_dequant_row_ref(*l.affine, out - 1, ref.data());
          ASSERT_EQ(row, ref);
        }
}

TEST(QuantKernels, Exl3MatchesReference) {
  std::mt19937 rng(9);
  struct Shape { int64_t in, out; };
  const Shape shapes[] = {{17, 1}, {63, 65}, {128, 129}, {129, 200}, {64, 3}, {256, 128}};
  const int64_t Ts[] = {1, 2, 3, 17};
  int idx = 0;
  for (const auto& s : shapes)
    for (int K : {1, 2, 3, 4, 5, 6, 7, 8}) {
      const auto cb = Exl3Codebook(idx++ % 3);
      auto f = random_exl3(s.in, s.out, K, cb, K % 2 == 0, rng);
      auto l = exl3_linear(f.w);
      for (int64_t T : Ts) {
        auto x = randn(size_t(T * s.in), rng);
        std::vector<float> y(static_cast<size_t>(T * s.out)), yr(static_cast<size_t>(T * s.out));
        cpu::matmul_quantized(l, x.data(), T, y.data());
        cpu::matmul_quantized_ref(l, x.data(), T, yr.data());
        ASSERT_LT(rel_rms(y, yr), 1e-5) << s.in << "x" << s.out << " K" << K << " T" << T;
      }
      // weight_row (column j of the k-major W) against the product with unit vectors
      for (int64_t j : {int64_t(0), s.out - 1}) {
        std::vector<float> row(static_cast<size_t>(s.in));
        cpu::weight_row_quantized(l, j, row.data());
        for (int64_t k : {int64_t(0), s.in / 2, s.in - 1}) {
          std::vector<float> e(static_cast<size_t>(s.in), 0.0f), y(static_cast<size_t>(s.out));
          e[size_t(k)] = 1.0f;
          Exl3Weight nb = f.w;
          nb.bias = nullptr;
          exl3_forward_ref(nb, e.data(), 1, y.data());
          ASSERT_NEAR(row[size_t(k)], y[size_t(j)], 1e-5f * (1.0f + std::fabs(y[size_t(j)])));
        }
      }
    }
}

TEST(QuantKernels, Exl3OutputGather) {
  std::mt19937 rng(13);
  auto f = random_exl3(100, 300, 3, Exl3Codebook::Mcg, true, rng);
  auto full = exl3_linear(f.w);
  std::vector<int32_t> rows = {299, 0, 5, 128, 127, 200, 5};
  Exl3Weight g = f.w;
  g.out = int64_t(rows.size());
  g.out_rows = rows.data();
  auto sel = exl3_linear(g);
  for (int64_t T : {1, 3, 17}) {
    auto x = randn(size_t(T * 100), rng);
    std::vector<float> y(static_cast<size_t>(T * 300)), ys(static_cast<size_t>(T) * rows.size()), yr(static_cast<size_t>(T) * rows.size());
    cpu::matmul_quantized(full, x.data(), T, y.data());
    cpu::matmul_quantized(sel, x.data(), T, ys.data());
    cpu::matmul_quantized_ref(sel, x.data(), T, yr.data());
    for (int64_t t = 0; t < T; ++t)
      for (size_t j = 0; j < rows.size(); ++j) {
        ASSERT_FLOAT_EQ(ys[size_t(t) * rows.size() + j], y[size_t(t * 300 + rows[j])]);
        ASSERT_NEAR(yr[size_t(t) * rows.size() + j], ys[size_t(t) * rows.size() + j], 1e-4);
      }
  }
}
