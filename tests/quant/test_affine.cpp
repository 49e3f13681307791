// MLX affine: pack/unpack against the plain bit-stream reader, quantize round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/half.h"
#include "quant/affine/affine.h"

using namespace lily;
using namespace lily::quant;

TEST(Affine, PackUnpackAllBits) {
  std::mt19937 rng(3);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int64_t n : {32, 64, 96, 160}) {
      if ((n * bits) % 32) continue;
      std::vector<uint8_t> codes(static_cast<size_t>(n)), back(static_cast<size_t>(n));
      for (auto& c : codes) c = uint8_t(rng() & ((1u << bits) - 1));
      std::vector<uint32_t> row(static_cast<size_t>(n * bits / 32));
      affine_pack(codes.data(), bits, n, row.data());
      affine_unpack(row.data(), bits, n, back.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(back[size_t(i)], codes[size_t(i)]) << bits << " " << i;
        ASSERT_EQ(affine_code(row.data(), bits, i), codes[size_t(i)]);
      }
    }
}

TEST(Affine, KnownLayouts) {
  // 4 bits: 8 codes per word, first code in the lowest nibble (mlx).
  uint8_t c4[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint32_t w4 = 0;
  affine_pack(c4, 4, 8, &w4);
  EXPECT_EQ(w4, 0x87654321u);
  // 3 bits: mlx's byte layout: byte0 = c0 | c1 << 3 | (c2 & 3) << 6.
  uint8_t c3[32];
  for (int i = 0; i < 32; ++i) c3[i] = uint8_t(i % 8);
  uint32_t w3[3];
  affine_pack(c3, 3, 32, w3);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(w3);
  EXPECT_EQ(b[0], uint8_t(0 | (1 << 3) | ((2 & 3) << 6)));
  EXPECT_EQ(b[1], uint8_t((2 >> 2) | (3 << 1) | (4 << 4) | ((5 & 1) << 7)));
  // 6 bits: 4 codes in 3 bytes, byte0 = c0 | (c1 & 3) << 6.
  uint8_t c6[16] = {63, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  uint32_t w6[3];
  affine_pack(c6, 6, 16, w6);
  const uint8_t* b6 = reinterpret_cast<const uint8_t*>(w6);
  EXPECT_EQ(b6[0], uint8_t(63 | (1 << 6)));
  EXPECT_EQ(b6[1], uint8_t(0 | (2 << 4)));
}

TEST(Affine, QuantizeRoundTrip) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int g : {32, 64, 128})
      for (DType dt : {DType::BF16, DType::F16}) {
        const int64_t out = 5, in = 256;
        std::vector<float> w(static_cast<size_t>(out * in));
        for (auto& v : w) v = nd(rng);
        auto q = affine_quantize(w.data(), out, in, bits, g, dt);
        auto v = q.view();
        affine_validate(v, "test");
        std::vector<float> row(static_cast<size_t>(in)), ref(static_cast<size_t>(in));
        for (int64_t o = 0; o < out; ++o) {
          affine_dequant_row(v, o, row.data());
          affine_dequant_row_ref(v, o, ref.data());
          for (int64_t i = 0; i < in; ++i) {
            ASSERT_EQ(row[size_t(i)], ref[size_t(i)]);
            const float s = std::fabs(affine_scale(v, o, i / g));
            // one step (half a step of rounding; pinning the edge to an integer code can shrink the
            // covered range of the other edge by up to half a step) plus the rounding of scale and bias
            const float tol = 1.0f * s + (dt == DType::BF16 ? 1.0f / 128 : 1.0f / 1024) * (std::fabs(w[size_t(o * in + i)]) + s * float(1 << bits));
            ASSERT_LE(std::fabs(row[size_t(i)] - w[size_t(o * in + i)]), tol) << bits << " g" << g;
          }
        }
      }
}

TEST(Affine, EdgeIsExactAndZeroGroup) {
  // A group whose larger-magnitude edge is the minimum: that value comes back (up to the scale dtype).
  std::vector<float> w(32);
  for (int i = 0; i < 32; ++i) w[size_t(i)] = -1.0f + 0.04f * float(i);
  auto q = affine_quantize(w.data(), 1, 32, 4, 32, DType::F16);
  auto v = q.view();
  std::vector<float> row(32);
  affine_dequant_row(v, 0, row.data());
  EXPECT_NEAR(row[0], -1.0f, 1e-3f);
  EXPECT_EQ(affine_code(q.packed.data(), 4, 0), 0u);
  // An all-zero group: eps scale, zero bias, dequantises to zeros.
  std::vector<float> z(32, 0.0f);
  auto qz = affine_quantize(z.data(), 1, 32, 4, 32, DType::BF16);
  auto vz = qz.view();
  affine_dequant_row(vz, 0, row.data());
  for (float x : row) EXPECT_EQ(x, 0.0f);
}

TEST(Affine, RefusesBadParameters) {
  std::vector<float> w(64, 0.0f);
  EXPECT_THROW(affine_quantize(w.data(), 1, 64, 7, 64), std::runtime_error);
  EXPECT_THROW(affine_quantize(w.data(), 1, 64, 4, 48), std::runtime_error);
  EXPECT_THROW(affine_quantize(w.data(), 1, 64, 4, 128), std::runtime_error);
}
