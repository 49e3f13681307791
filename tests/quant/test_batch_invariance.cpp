// Batch invariance of the CPU products: row t of a T-row product equals, bit for bit, the product of that
// row alone, in every format and path. Multi-sequence steps depend on it: a sequence's logits must not
// change with what it is batched with.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cpu/matmul.h"
#include "core/half.h"
#include "model/linear.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"
#include "../model/test_util.h"

using namespace lily;

namespace {

using lily::test::randn;

const int64_t kRows[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33};

// Every row of the T-row product against that row alone; also through matmul_batch.
void expect_invariant(const Linear& l, cpu::AffinePath path, std::mt19937& rng, const std::string& what) {
  for (int64_t T : kRows) {
    auto x = randn(size_t(T * l.in), rng);
    std::vector<float> y(size_t(T * l.out)), yb(size_t(T * l.out)), one(size_t(l.out));
    cpu::matmul(l, x.data(), T, y.data(), path);
    const cpu::MatJob job{&l, x.data(), T, yb.data()};
    cpu::matmul_batch(std::span(&job, 1), path);
    for (int64_t t = 0; t < T; ++t) {
      cpu::matmul(l, x.data() + t * l.in, 1, one.data(), path);
      ASSERT_EQ(0, std::memcmp(one.data(), y.data() + t * l.out, size_t(l.out) * 4)) << what << " T=" << T << " row " << t;
      ASSERT_EQ(0, std::memcmp(one.data(), yb.data() + t * l.out, size_t(l.out) * 4))
          << what << " (batch) T=" << T << " row " << t;
    }
  }
}

TEST(BatchInvariance, Dense) {
  std::mt19937 rng(1);
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (auto [out, in] : {std::pair<int64_t, int64_t>{1, 1}, {17, 33}, {64, 64}, {65, 129}, {300, 256}, {7, 1000}}) {
      auto v = randn(size_t(out * in), rng, 0.1f);
      std::vector<uint8_t> bytes(size_t(out * in) * dtype_size(dt));
      for (int64_t i = 0; i < out * in; ++i) {
        if (dt == DType::F32) {
          std::memcpy(bytes.data() + 4 * i, &v[size_t(i)], 4);
        } else {
          const uint16_t h = dt == DType::BF16 ? f32_to_bf16(v[size_t(i)]) : f32_to_f16(v[size_t(i)]);
          std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
      }
      Linear l;
      l.name = "dense";
      l.out = out;
      l.in = in;
      l.dense = {dt, bytes.data(), in};
      expect_invariant(l, cpu::AffinePath::Exact, rng, std::string(dtype_name(dt)) + " " + std::to_string(out) + "x" + std::to_string(in));
    }
}

TEST(BatchInvariance, Affine) {
  std::mt19937 rng(2);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int g : {32, 64, 128})
      for (auto [out, in] : {std::pair<int64_t, int64_t>{3, 128}, {65, 256}, {129, 384}}) {
        if (in % g) continue;
        auto w = randn(size_t(out * in), rng, 0.1f);
        auto q = quant::affine_quantize(w.data(), out, in, bits, g, DType::BF16);
        Linear l;
        l.name = "affine";
        l.out = out;
        l.in = in;
        l.format = WeightFormat::Affine;
        l.affine = std::make_shared<quant::AffineWeight>(q.view());
        const std::string what = std::to_string(bits) + "-bit g" + std::to_string(g) + " " + std::to_string(out) + "x" + std::to_string(in);
        expect_invariant(l, cpu::AffinePath::Exact, rng, what + " exact");
        expect_invariant(l, cpu::AffinePath::Int8, rng, what + " int8");
      }
}

TEST(BatchInvariance, Exl3) {
  std::mt19937 rng(3);
  for (int K : {2, 4}) {
    const int64_t in = 256, out = 200, kp = 256, np = 256;
    std::vector<uint16_t> trellis(size_t(kp / 16 * np / 16 * 16 * K)), suh, svh;
    for (auto& v : trellis) v = uint16_t(rng());
    for (int64_t i = 0; i < kp; ++i) suh.push_back(f32_to_f16((rng() & 1 ? -1.0f : 1.0f) * 0.05f));
    for (int64_t i = 0; i < np; ++i) svh.push_back(f32_to_f16((rng() & 1 ? -1.0f : 1.0f)));
    quant::Exl3Weight e;
    e.K = K;
    e.codebook = quant::Exl3Codebook::Mcg;
    e.in = in;
    e.out = out;
    e.in_p = kp;
    e.out_p = np;
    e.trellis = trellis.data();
    e.suh = suh.data();
    e.svh = svh.data();
    Linear l;
    l.name = "exl3";
    l.out = out;
    l.in = in;
    l.format = WeightFormat::Exl3;
    l.exl3 = std::make_shared<quant::Exl3Weight>(e);
    expect_invariant(l, cpu::AffinePath::Exact, rng, "exl3 K" + std::to_string(K));
  }
}

}  // namespace
