// EXL3 decode: worked example of exl3-format.md §2.4, golden vectors (bit-exact W_hat, y), pack/unpack.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/matmul.h"
#include "core/half.h"
#include "io/safetensors.h"
#include "model/linear.h"
#include "quant/exl3/exl3.h"

using namespace lily;
using namespace lily::quant;

TEST(Exl3Decode, WorkedExampleK4) {
  uint16_t T[64];
  for (int i = 0; i < 64; ++i) T[i] = uint16_t(((i * 0x9E37) ^ 0x5A5A) & 0xFFFF);
  uint16_t st[256], ref[256];
  exl3_tile_states(T, 4, st);
  exl3_tile_states_ref(T, 4, ref);
  for (int t = 0; t < 256; ++t) ASSERT_EQ(st[t], ref[t]) << t;
  EXPECT_EQ(st[0], 0xb08c);
  EXPECT_EQ(st[1], 0x08c4);
  EXPECT_EQ(st[2], 0x8c46);
  EXPECT_EQ(st[3], 0xc46d);
  EXPECT_EQ(st[4], 0x46d5);
  EXPECT_EQ(st[7], 0x5a5a);
  EXPECT_EQ(st[8], 0xa5a8);
  EXPECT_EQ(st[255], 0x0b08);
  // Codebook values of the table in §2.4 (printed to 6 decimals there).
  struct Row { int t; float v[3]; };
  const Row rows[] = {{0, {-1.058594f, 1.513672f, 0.749512f}},  {1, {0.133301f, 0.766602f, 0.810059f}},
                      {2, {0.018799f, 0.682617f, 1.209961f}},   {3, {-0.446289f, -0.840332f, -1.632812f}},
                      {4, {0.521484f, -1.059570f, -0.340088f}}, {7, {0.135498f, 0.297607f, 0.586914f}},
                      {8, {1.726562f, -2.191406f, 0.688477f}},  {255, {1.466797f, -0.388672f, 0.647949f}}};
  for (const auto& r : rows)
    for (int cb = 0; cb < 3; ++cb)
      EXPECT_NEAR(f16_to_f32(exl3_decode_state(Exl3Codebook(cb), st[r.t])), r.v[cb], 6e-7) << r.t << " cb " << cb;
  // The RNE tie of §2.4: -1.05908203125 rounds to -1.05859375.
  EXPECT_EQ(f16_to_f32(exl3_decode_state(Exl3Codebook::Inst3, 0xb08c)), -1.05859375f);
  // Tensor-core permutation examples of §3.
  const uint8_t* p = exl3_tc_perm();
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[1], 16);
  EXPECT_EQ(p[2], 8 * 16);
  EXPECT_EQ(p[3], 9 * 16);
  EXPECT_EQ(p[4], 8);
  EXPECT_EQ(p[8], 2 * 16);
  EXPECT_EQ(p[32], 1);
  EXPECT_EQ(p[255], 255);
}

TEST(Exl3Decode, CodebookStatistics) {
  // exl3-format.md §2.3 table (all 65536 states).
  const double want_sd[3] = {1.2437109, 1.2441119, 1.0003102};
  for (int cb = 0; cb < 3; ++cb) {
    const float* l = exl3_lut(Exl3Codebook(cb));
    const uint16_t* h = exl3_lut_f16(Exl3Codebook(cb));
    double m = 0, q = 0;
    for (int s = 0; s < 65536; ++s) {
      ASSERT_EQ(f16_to_f32(h[s]), l[s]);
      m += l[s];
    }
    m /= 65536;
    for (int s = 0; s < 65536; ++s) q += (l[s] - m) * (l[s] - m);
    EXPECT_NEAR(std::sqrt(q / 65536), want_sd[cb], 2e-6) << cb;
  }
}

TEST(Exl3Decode, PackUnpackRoundTrip) {
  std::mt19937 rng(7);
  for (int K = 1; K <= 8; ++K) {
    uint16_t codes[256], words[128], st[256], ref[256], words2[128];
    for (auto& c : codes) c = uint16_t(rng() & ((1u << K) - 1));
    exl3_pack_tile(codes, K, words);
    exl3_tile_states(words, K, st);
    exl3_tile_states_ref(words, K, ref);
    for (int t = 0; t < 256; ++t) {
      ASSERT_EQ(st[t], ref[t]);
      ASSERT_EQ(st[t] & ((1u << K) - 1), codes[t]) << "K " << K << " t " << t;
      ASSERT_EQ(st[t], uint16_t(((st[(t + 255) % 256] << K) | codes[t]) & 0xFFFF)) << "K " << K << " t " << t;
    }
    exl3_pack_tile(st, K, words2);
    for (int i = 0; i < 16 * K; ++i) ASSERT_EQ(words[i], words2[i]);
    // random words decode the same through both extractors
    for (int i = 0; i < 16 * K; ++i) words[i] = uint16_t(rng());
    exl3_tile_states(words, K, st);
    exl3_tile_states_ref(words, K, ref);
    for (int t = 0; t < 256; ++t) ASSERT_EQ(st[t], ref[t]);
  }
}

namespace {
const TensorInfo& get(const SafeTensorsFile& f, const std::string& n) {
  auto it = f.tensors().find(n);
  if (it == f.tensors().end()) throw std::runtime_error("missing " + n);
  return it->second;
}
}  // namespace

TEST(Exl3Decode, GoldenVectorsBitExact) {
  SafeTensorsFile f(std::string(LILY_TEST_DATA) + "/golden/exl3/vectors.safetensors");
  int cases = 0;
  for (int K = 1; K <= 8; ++K)
    for (int cb = 0; cb < 3; ++cb) {
      const std::string p = "k" + std::to_string(K) + "_cb" + std::to_string(cb) + ".";
      const auto& tr = get(f, p + "trellis");
      const auto& suh = get(f, p + "suh");
      const auto& svh = get(f, p + "svh");
      const auto& what = get(f, p + "w_hat");
      const auto& x = get(f, p + "x");
      const auto& y = get(f, p + "y");
      ASSERT_EQ(tr.shape, (std::vector<int64_t>{8, 16, 16 * K}));
      Exl3Weight w;
      w.K = K;
      w.codebook = Exl3Codebook(cb);
      w.in = w.in_p = 128;
      w.out = w.out_p = 256;
      w.trellis = reinterpret_cast<const uint16_t*>(tr.data);
      w.suh = reinterpret_cast<const uint16_t*>(suh.data);
      w.svh = reinterpret_cast<const uint16_t*>(svh.data);
      // W_hat bit for bit
      const uint16_t* want = reinterpret_cast<const uint16_t*>(what.data);
      const uint16_t* lut = exl3_lut_f16(w.codebook);
      const uint8_t* perm = exl3_tc_perm();
      int bad = 0;
      for (int64_t i = 0; i < 8; ++i)
        for (int64_t j = 0; j < 16; ++j) {
          uint16_t st[256];
          exl3_tile_states(w.tile(i, j), K, st);
          for (int t = 0; t < 256; ++t) {
            const int r = perm[t] / 16, c = perm[t] % 16;
            bad += lut[st[t]] != want[(16 * i + r) * 256 + 16 * j + c];
          }
        }
      EXPECT_EQ(bad, 0) << p;
      // y = x · W: reference (float64) and the threaded CPU kernel, to fp32 rounding.
      const float* xs = reinterpret_cast<const float*>(x.data);
      const float* ys = reinterpret_cast<const float*>(y.data);
      std::vector<float> yr(3 * 256), yk(3 * 256);
      exl3_forward_ref(w, xs, 3, yr.data());
      Linear l;
      l.name = p;
      l.out = 256;
      l.in = 128;
      l.format = WeightFormat::Exl3;
      l.exl3 = std::make_shared<Exl3Weight>(w);
      cpu::matmul_quantized(l, xs, 3, yk.data());
      double num = 0, den = 0, numk = 0;
      for (int i = 0; i < 3 * 256; ++i) {
        num += double(yr[size_t(i)] - ys[i]) * (yr[size_t(i)] - ys[i]);
        numk += double(yk[size_t(i)] - ys[i]) * (yk[size_t(i)] - ys[i]);
        den += double(ys[i]) * ys[i];
      }
      EXPECT_LT(std::sqrt(num / den), 1e-6) << p;
      EXPECT_LT(std::sqrt(numk / den), 3e-6) << p;
      ++cases;
    }
  EXPECT_EQ(cases, 24);
}
