// The CPU emulation of the CUDA backend's bf16- and fp16-operand prompt GEMMs (backend/cpu/operand_emulation.h)
// against plain references at awkward sizes, the fp16 mode's per-row scale on rows of every magnitude (zero,
// tiny, beyond fp16's range, inf, NaN), and the wiring through the CPU backend (CpuOptions::emulate_bf16 /
// emulate_fp16): each product class reaches its products, steps below emulate_bf16_rows rows (decode) are
// untouched, and the masks off leave every logit as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "backend/cpu/operand_emulation.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/fp16_scale.h"
#include "backend/product_class.h"
#include "core/error.h"
#include "core/half.h"
#include "model/qwen_hybrid.h"
#include "quant/affine/affine.h"
#include "test_util.h"

using namespace lily;

namespace {

using test::randn;

// A weight matrix in one of the formats the emulation covers, and its values as float.
struct Mat {
  std::vector<uint8_t> bytes;
  quant::AffineQuantized aq;
  std::shared_ptr<quant::AffineWeight> aw;
  Linear lin;
};

Mat make(const char* kind, int64_t out, int64_t in, uint32_t seed, bool bf16_values) {
  auto v = randn(size_t(out * in), seed, 1.0f / std::sqrt(float(in)));
  if (bf16_values)
    for (auto& x : v) x = cpu::round_bf16(x);
  Mat m;
  m.lin.name = std::string("test.") + kind;
  m.lin.out = out;
  m.lin.in = in;
  const std::string k = kind;
  if (k == "bf16" || k == "f32") {
    const DType dt = k == "bf16" ? DType::BF16 : DType::F32;
    m.bytes.resize(size_t(out * in) * dtype_size(dt));
    for (int64_t i = 0; i < out * in; ++i) {
      if (dt == DType::F32) std::memcpy(m.bytes.data() + 4 * i, &v[size_t(i)], 4);
      else {
        const uint16_t h = f32_to_bf16(v[size_t(i)]);
        std::memcpy(m.bytes.data() + 2 * i, &h, 2);
      }
    }
    m.lin.dense = {dt, m.bytes.data(), in};
  } else {  // affine 4-bit, groups of 32
    m.aq = quant::affine_quantize(v.data(), out, in, 4, 32);
    m.aw = std::make_shared<quant::AffineWeight>(m.aq.view());
    m.lin.format = WeightFormat::Affine;
    m.lin.affine = m.aw;
  }
  return m;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Σ|x̂|·|ŵ| per output (the scale of the rounding and accumulation errors), from float operands.
std::vector<double> abs_sums(const Linear& W, const std::vector<float>& x, int64_t T, bool round) {
  std::vector<double> s(size_t(T * W.out));
  std::vector<float> row(size_t(W.in));
  for (int64_t n = 0; n < W.out; ++n) {
    cpu::weight_row(W, n, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double a = 0;
      for (int64_t k = 0; k < W.in; ++k) {
        const float xv = x[size_t(t * W.in + k)], wv = row[size_t(k)];
        a += std::fabs(double(round ? cpu::round_bf16(xv) : xv)) * std::fabs(double(round ? cpu::round_bf16(wv) : wv));
      }
      s[size_t(t * W.out + n)] = a;
    }
  }
  return s;
}

const int64_t kRows[] = {1, 2, 3, 17, 65, 129};
const std::pair<int64_t, int64_t> kShapes[] = {{33, 64}, {17, 96}, {300, 128}};  // (out, in)

}  // namespace

// Operands already bf16: the emulation is the float32 product itself, bit for bit, and within fp32
// accumulation of the double reference.
TEST(Bf16Emulation, RepresentableOperandsMatchTheFloatProduct) {
  for (const char* kind : {"bf16", "f32"})
    for (auto [N, K] : kShapes)
      for (int64_t T : kRows) {
        SCOPED_TRACE(std::string(kind) + " T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
        Mat m = make(kind, N, K, uint32_t(N * 31 + K), true);
        auto x = randn(size_t(T * K), uint32_t(T + 7));
        for (auto& v : x) v = cpu::round_bf16(v);
        std::vector<float> e(size_t(T * N), NAN), f(size_t(T * N), NAN), r(size_t(T * N));
        cpu::matmul_bf16_operands(m.lin, x.data(), T, e.data());
        cpu::matmul(m.lin, x.data(), T, f.data(), cpu::AffinePath::Exact);
        cpu::matmul_bf16_operands_ref(m.lin, x.data(), T, r.data());
        EXPECT_TRUE(same(e, f));
        const auto s = abs_sums(m.lin, x, T, false);
        for (size_t i = 0; i < e.size(); ++i) ASSERT_LE(std::fabs(double(e[i]) - r[i]), 1e-6 * s[i] + 1e-30) << i;
      }
}

// General operands: the emulation equals the double reference of the rounded operands up to fp32 accumulation
// (K·2^-24·Σ|x̂ŵ|), and differs from the unrounded product by the bf16 rounding of both (at most ~2^-8·Σ|x||w|,
// and visibly: some outputs move by more than the fp32 accumulation could).
TEST(Bf16Emulation, GeneralOperandsWithinTheRoundingBound) {
  for (const char* kind : {"bf16", "f32", "affine4"})
    for (auto [N, K] : kShapes)
      for (int64_t T : kRows) {
        SCOPED_TRACE(std::string(kind) + " T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
        Mat m = make(kind, N, K, uint32_t(N * 17 + K), false);
        auto x = randn(size_t(T * K), uint32_t(3 * T + 1));
        std::vector<float> e(size_t(T * N), NAN), r(size_t(T * N)), f(size_t(T * N));
        cpu::matmul_bf16_operands(m.lin, x.data(), T, e.data());
        cpu::matmul_bf16_operands_ref(m.lin, x.data(), T, r.data());
        cpu::matmul_ref(m.lin, x.data(), T, f.data());
        const auto sr = abs_sums(m.lin, x, T, true), s = abs_sums(m.lin, x, T, false);
        double moved = 0;
        for (size_t i = 0; i < e.size(); ++i) {
          ASSERT_TRUE(std::isfinite(e[i])) << "unwritten output " << i;
          ASSERT_LE(std::fabs(double(e[i]) - r[i]), double(K) * std::ldexp(1.0, -24) * sr[i] + 1e-30) << i;
          const double d = std::fabs(double(e[i]) - f[i]);
          ASSERT_LE(d, std::ldexp(1.0, -8) * 1.01 * s[i] + 1e-30) << i;
          moved = std::max(moved, d / s[i]);
        }
        EXPECT_GT(moved, double(K) * std::ldexp(1.0, -24)) << "no output shows the bf16 rounding";
      }
}

// The split mode (Operand::kSplit): x = x_hi + x_lo and W = w_hi + w_lo in bf16, y = (x_hi + x_lo)·w_hi +
// x_hi·w_lo. Equals its double reference up to fp32 accumulation, sits within ~2^-15·Σ|x||w| of the float
// product (16 significant bits per operand, the dropped x_lo·w_lo term), and with bf16 weights is the float
// product of the hi + lo activations bit for bit.
TEST(SplitEmulation, WithinTheSplitBound) {
  for (const char* kind : {"bf16", "f32", "affine4"})
    for (auto [N, K] : kShapes)
      for (int64_t T : kRows) {
        SCOPED_TRACE(std::string(kind) + " T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
        Mat m = make(kind, N, K, uint32_t(N * 13 + K), false);
        auto x = randn(size_t(T * K), uint32_t(5 * T + 2));
        std::vector<float> e(size_t(T * N), NAN), r(size_t(T * N)), f(size_t(T * N));
        cpu::matmul_reduced_operands(cpu::Operand::kSplit, m.lin, x.data(), T, e.data());
        cpu::matmul_reduced_operands_ref(cpu::Operand::kSplit, m.lin, x.data(), T, r.data());
        cpu::matmul_ref(m.lin, x.data(), T, f.data());
        const auto s = abs_sums(m.lin, x, T, false);
        for (size_t i = 0; i < e.size(); ++i) {
          ASSERT_LE(std::fabs(double(e[i]) - r[i]), double(K) * std::ldexp(1.0, -24) * 1.01 * s[i] + 1e-30) << i;
          ASSERT_LE(std::fabs(double(e[i]) - f[i]), std::ldexp(1.0, -15) * s[i] + 1e-30) << i;
        }
        if (std::string(kind) == "bf16") {
          std::vector<float> xs(x), g(e.size());
          for (auto& v : xs) v = cpu::round_bf16(v) + cpu::round_bf16(v - cpu::round_bf16(v));
          cpu::matmul(m.lin, xs.data(), T, g.data(), cpu::AffinePath::Exact);
          EXPECT_TRUE(same(e, g));
        }
      }
}

// k_order (CpuOptions::emulate_k_order): the same rounded operands summed over k reversed or from the middle round —
// within the fp32 accumulation bound of the in-order result in every mode and format, and not the same bits.
TEST(OperandEmulation, OtherOrdersOnlyReorder) {
  for (int k_order : {1, 2})
    for (cpu::Operand op : {cpu::Operand::kBf16, cpu::Operand::kFp16, cpu::Operand::kSplit})
      for (const char* kind : {"bf16", "f32", "affine4"}) {
        SCOPED_TRACE(std::string(kind) + " operand " + std::to_string(int(op)) + " k_order " + std::to_string(k_order));
        const int64_t N = 300, K = 128, T = 65;
        Mat m = make(kind, N, K, 7, false);
        auto x = randn(size_t(T * K), 11);
        std::vector<float> a(size_t(T * N), NAN), b(size_t(T * N), NAN);
        cpu::matmul_reduced_operands(op, m.lin, x.data(), T, a.data());
        cpu::matmul_reduced_operands(op, m.lin, x.data(), T, b.data(), k_order);
        const auto s = abs_sums(m.lin, x, T, op == cpu::Operand::kBf16);
        int differ = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_TRUE(std::isfinite(b[i])) << "unwritten output " << i;
          // both within K·2^-24·Σ|x̃||w̃| of the exact sum of the rounded products (x̃, w̃ within 2^-10 of x, w)
          ASSERT_LE(std::fabs(double(a[i]) - b[i]), 2.1 * double(K) * std::ldexp(1.0, -24) * s[i] + 1e-30) << i;
          differ += a[i] != b[i];
        }
        EXPECT_GT(differ, 0) << "the reordered sums gave the same bits everywhere";
      }
}

// The per-row exponent: the scaled maximum lands in [2^14, 2^15) wherever 2^e stays a normal float (maxima from
// 2^-112 up); zero, inf and NaN keep e = 0; the extremes clamp to ±126.
TEST(Fp16Emulation, RowExponentRule) {
  for (float m : {1.0f, 0.75f, 3.0f, 65504.0f, 1e5f, 1e-3f, 6e-5f, 1e-20f, 1e30f, 2e-34f})
    for (float f : {1.0f, 1.4999f, 1.9999f}) {
      const float v = m * f;
      const float scaled = v * pow2f(fp16_row_exponent(v));
      EXPECT_GE(scaled, 16384.0f) << v;
      EXPECT_LT(scaled, 32768.0f) << v;
    }
  EXPECT_EQ(fp16_row_exponent(1.0f), 14);
  EXPECT_EQ(fp16_row_exponent(65504.0f), -1);
  EXPECT_EQ(fp16_row_exponent(0.0f), 0);
  EXPECT_EQ(fp16_row_exponent(INFINITY), 0);
  EXPECT_EQ(fp16_row_exponent(NAN), 0);
  EXPECT_EQ(fp16_row_exponent(1.17549435e-38f), 126);  // 2^-126: clamped, the scaled max is 1
  EXPECT_EQ(fp16_row_exponent(1e-40f), 126);           // subnormal: scaled max below 1, still a normal fp16
  EXPECT_EQ(fp16_row_exponent(3e38f), -113);
  EXPECT_EQ(pow2f(-126), std::ldexp(1.0f, -126));
  EXPECT_EQ(pow2f(126), std::ldexp(1.0f, 126));
}

namespace {

// Rows of very different magnitudes: row t scaled by 10^(t % 9 - 4) · (1e3 every fifth row), so some rows
// exceed fp16's 65,504 and some sit far below its normal range.
std::vector<float> wide_rows(int64_t T, int64_t K, uint32_t seed) {
  auto x = randn(size_t(T * K), seed);
  for (int64_t t = 0; t < T; ++t) {
    const float sc = std::pow(10.0f, float(t % 9 - 4)) * (t % 5 == 4 ? 1e3f : 1.0f);
    for (int64_t k = 0; k < K; ++k) x[size_t(t * K + k)] *= sc;
  }
  return x;
}

}  // namespace

// fp16 operands: the emulation equals the double reference of the scaled, rounded operands up to fp32
// accumulation, and differs from the unrounded product by at most the two fp16 roundings (2·2^-11 relative per
// product, plus 2^-25 absolute per weight below fp16's normal range) — on rows of every magnitude, which unscaled
// fp16 would flush to zero or overflow. Its mean error is several times below the bf16 mode's.
TEST(Fp16Emulation, GeneralOperandsWithinTheRoundingBound) {
  for (const char* kind : {"bf16", "f32", "affine4"})
    for (auto [N, K] : kShapes)
      for (int64_t T : kRows) {
        SCOPED_TRACE(std::string(kind) + " T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
        Mat m = make(kind, N, K, uint32_t(N * 13 + K), false);
        const auto x = wide_rows(T, K, uint32_t(5 * T + 2));
        std::vector<float> e(size_t(T * N), NAN), r(size_t(T * N)), f(size_t(T * N)), b(size_t(T * N));
        cpu::matmul_reduced_operands(cpu::Operand::kFp16, m.lin, x.data(), T, e.data());
        cpu::matmul_reduced_operands_ref(cpu::Operand::kFp16, m.lin, x.data(), T, r.data());
        cpu::matmul_ref(m.lin, x.data(), T, f.data());
        cpu::matmul_bf16_operands(m.lin, x.data(), T, b.data());
        const auto s = abs_sums(m.lin, x, T, false);
        std::vector<double> sx(size_t(T), 0.0);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t k = 0; k < K; ++k) sx[size_t(t)] += std::fabs(double(x[size_t(t * K + k)]));
        double moved = 0, err16 = 0, err_bf = 0;
        for (size_t i = 0; i < e.size(); ++i) {
          ASSERT_TRUE(std::isfinite(e[i])) << "unwritten or overflowed output " << i;
          const double si = s[i] + 1e-300;
          ASSERT_LE(std::fabs(double(e[i]) - r[i]), double(K) * std::ldexp(1.0, -23) * si) << i;
          const double d = std::fabs(double(e[i]) - f[i]);
          ASSERT_LE(d, (std::ldexp(1.0, -10) * 1.01 + double(K) * std::ldexp(1.0, -23)) * si +
                           std::ldexp(1.0, -25) * sx[i / size_t(N)]) << i;
          moved = std::max(moved, d / si);
          err16 += d / si;
          err_bf += std::fabs(double(b[i]) - f[i]) / si;
        }
        EXPECT_GT(moved, double(K) * std::ldexp(1.0, -24)) << "no output shows the fp16 rounding";
        EXPECT_LT(err16, err_bf / 3) << "fp16 mean relative error not well below bf16's";
      }
}

// Rows whose maximum is 0, inf or NaN: zeros give zeros, a NaN stays NaN in every output of its row, an inf
// overflows its row (inf or NaN, as the fp32 product); the other rows are what they are alone.
TEST(Fp16Emulation, ZeroInfNanRows) {
  const int64_t N = 33, K = 96, T = 5;
  Mat m = make("affine4", N, K, 77, false);
  auto x = randn(size_t(T * K), 9);
  for (int64_t k = 0; k < K; ++k) x[size_t(1 * K + k)] = 0.0f;
  x[size_t(2 * K + 17)] = NAN;
  x[size_t(3 * K + 40)] = INFINITY;
  std::vector<float> e(size_t(T * N), 0.0f), alone(static_cast<size_t>(N));
  cpu::matmul_reduced_operands(cpu::Operand::kFp16, m.lin, x.data(), T, e.data());
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(e[size_t(1 * N + n)], 0.0f) << n;
    EXPECT_TRUE(std::isnan(e[size_t(2 * N + n)])) << n;
    EXPECT_FALSE(std::isfinite(e[size_t(3 * N + n)])) << n;
  }
  for (int64_t t : {int64_t(0), int64_t(4)}) {
    cpu::matmul_reduced_operands(cpu::Operand::kFp16, m.lin, x.data() + t * K, 1, alone.data());
    EXPECT_EQ(std::memcmp(alone.data(), e.data() + t * N, size_t(N) * 4), 0) << t;
  }
}

// Weights below fp16's normal range (2^-14) lose relative precision as subnormals. Measured: the relative RMS
// rounding error of N(0, σ²) weights in fp16 against bf16, by σ. fp16 stays >= 4x better down to σ = 1e-4
// (real checkpoints' matrices have σ ~ 1e-2); the two cross near σ = 1.5e-5.
TEST(Fp16Emulation, TinyWeightsMeasured) {
  for (float sigma : {2e-2f, 1e-3f, 1e-4f, 3e-5f, 1e-5f}) {
    const auto w = randn(1 << 16, 123, sigma);
    double e16 = 0, ebf = 0, ww = 0;
    int sub = 0;
    for (float v : w) {
      e16 += std::pow(double(cpu::round_fp16(v)) - v, 2);
      ebf += std::pow(double(cpu::round_bf16(v)) - v, 2);
      ww += double(v) * v;
      sub += std::fabs(v) < std::ldexp(1.0f, -14);
    }
    const double r16 = std::sqrt(e16 / ww), rbf = std::sqrt(ebf / ww);
    std::printf("sigma %.0e: fp16 relative RMS error %.2e, bf16 %.2e (ratio %.1f), %.1f%% below 2^-14\n", sigma, r16,
                rbf, rbf / r16, 100.0 * sub / double(w.size()));
    if (sigma >= 1e-4f) {
      EXPECT_GT(rbf / r16, 4.0) << sigma;
    }
  }
}

TEST(Bf16Emulation, OptionsByName) {
  cpu::CpuOptions o;
  cpu::set_cpu_option(o, "emulate_bf16=experts,attn_out,lm_head");
  EXPECT_EQ(o.emulate_bf16, uint32_t(kProdExpertsGateUp | kProdExpertsDown | kProdAttnOut | kProdLmHead));
  cpu::set_cpu_option(o, "emulate_bf16=gpu_bf16");
  EXPECT_EQ(o.emulate_bf16, uint32_t(kProdAll & ~uint32_t(kProdRouter)));
  EXPECT_EQ(product_class_names(kProdShared | kProdGdnIn), "shared,gdn_in");
  cpu::set_cpu_option(o, "emulate_bf16_rows=7");
  EXPECT_EQ(o.emulate_bf16_rows, 7);
  cpu::set_cpu_option(o, "emulate_fp16=all");
  EXPECT_EQ(o.emulate_fp16, uint32_t(kProdAll));
  cpu::set_cpu_option(o, "emulate_bf16_kv=1");
  EXPECT_TRUE(o.emulate_bf16_kv);
  cpu::set_cpu_option(o, "emulate_split=1");
  EXPECT_TRUE(o.emulate_split);
  cpu::set_cpu_option(o, "emulate_bf16_kv=0");
  EXPECT_FALSE(o.emulate_bf16_kv);
  cpu::set_cpu_option(o, "emulate_k_order=2");
  EXPECT_EQ(o.emulate_k_order, 2);
  for (const char* bad : {"emulate_bf16=experts,bogus", "emulate_bf16=", "emulate_bf16_rows=0", "emulate_bf16_rows=x",
                          "nosuch=1", "emulate_bf16", "affine=fp8", "emulate_fp16=bf16", "emulate_fp16=",
                          "emulate_bf16_kv=2", "emulate_bf16_kv=", "emulate_split=yes", "emulate_k_order=3", "emulate_k_order=-1"})
    EXPECT_THROW(cpu::set_cpu_option(o, bad), InputError) << bad;
  try {
    cpu::set_cpu_option(o, "emulate_bf16=experts,bogus");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'bogus'"), std::string::npos) << e.what();
  }
}

namespace {

struct Prefill {
  std::vector<float> logits, residual;
};

Prefill prefill(const std::shared_ptr<const ModelWeights>& w, uint32_t mask, int64_t T, int64_t min_rows = 33,
                cpu::Operand op = cpu::Operand::kBf16) {
  cpu::CpuOptions o;
  o.affine = cpu::AffinePath::Exact;
  (op == cpu::Operand::kBf16 ? o.emulate_bf16 : o.emulate_fp16) = mask;
  o.emulate_bf16_rows = min_rows;
  cpu::CpuBackend be(w, o);
  auto st = be.new_state(T + 4);
  const auto ids = test::random_ids(size_t(T), w->cfg.vocab, 5);
  Prefill r;
  r.logits.resize(size_t(T * w->cfg.vocab));
  forward_step(be, *st, ids, T, r.logits.data());
  r.residual = be.residual();
  return r;
}

}  // namespace

// For bf16 and fp16: every class the model has moves the logits of a 40-row step when emulated alone; a 32-row
// step (below the default emulate_bf16_rows) and the mask off give the float32 logits bit for bit; lm_head alone
// gives exactly the emulated product of the final-normed residual.
TEST(OperandEmulation, ClassesReachTheirProducts) {
  struct Case {
    const char* model;
    std::vector<uint32_t> classes;
  };
  const Case cases[] = {
      {"qwen3_5_moe_text-a", {kProdExpertsGateUp, kProdExpertsDown, kProdShared, kProdAttnIn, kProdAttnOut, kProdGdnIn,
                              kProdGdnOut, kProdRouter, kProdLmHead}},
      {"qwen3_next-a", {kProdExpertsGateUp, kProdShared, kProdGdnIn, kProdRouter}},
      {"qwen3_5_text-a-mtp", {kProdMlp, kProdAttnIn, kProdGdnOut}},
  };
  for (const Case& c : cases)
    for (cpu::Operand op : {cpu::Operand::kBf16, cpu::Operand::kFp16}) {
      const std::string dir = test::golden_dir(c.model);
      if (dir.empty()) continue;
      SCOPED_TRACE(std::string(c.model) + (op == cpu::Operand::kBf16 ? " bf16" : " fp16"));
      auto w = ModelWeights::load(dir);
      const Prefill off = prefill(w, 0, 40);
      EXPECT_TRUE(same(prefill(w, kProdAll, 32, 33, op).logits, prefill(w, 0, 32).logits)) << "a 32-row step changed";
      EXPECT_TRUE(same(prefill(w, kProdAll, 40, 41, op).logits, off.logits)) << "below emulate_bf16_rows changed";
      for (uint32_t cls : c.classes)
        EXPECT_FALSE(same(prefill(w, cls, 40, 33, op).logits, off.logits)) << product_class_names(cls);
      // a class the model lacks changes nothing
      const uint32_t absent = w->cfg.n_experts > 0 ? kProdMlp : kProdExpertsGateUp | kProdRouter;
      EXPECT_TRUE(same(prefill(w, absent | kProdMtpFc, 40, 33, op).logits, off.logits));
      const Prefill head = prefill(w, kProdLmHead, 40, 33, op);
      EXPECT_TRUE(same(head.residual, off.residual));
      const int64_t H = w->cfg.hidden;
      std::vector<float> h(size_t(40 * H)), want(head.logits.size());
      cpu::rms_norm(head.residual.data(), w->final_norm.data(), 40, H, float(w->cfg.rms_eps), h.data());
      cpu::matmul_reduced_operands(op, w->lm_head, h.data(), 40, want.data());
      EXPECT_TRUE(same(head.logits, want));
    }
}

// The bf16 KV cache of the CUDA backend (CpuOptions::emulate_bf16_kv): it moves the logits of a model with
// attention layers in every step, prompt and decode alike (one token after the prompt), by about a bf16 rounding of
// the keys and values (median |Δ| below 1% of the logits' RMS), and changes nothing with the option off.
TEST(OperandEmulation, Bf16KvCache) {
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  if (dir.empty()) GTEST_SKIP() << "golden model not present";
  auto w = ModelWeights::load(dir);
  const int64_t T = 24, V = w->cfg.vocab;
  auto run = [&](bool kv) {
    cpu::CpuOptions o;
    o.emulate_bf16_kv = kv;
    cpu::CpuBackend be(w, o);
    auto st = be.new_state(T + 4);
    const auto ids = test::random_ids(size_t(T + 1), V, 9);
    std::vector<float> l(size_t((T + 1) * V));
    forward_step(be, *st, std::vector<int32_t>(ids.begin(), ids.begin() + T), T, l.data());
    forward_step(be, *st, std::vector<int32_t>(ids.begin() + T, ids.end()), 1, l.data() + T * V);
    return l;
  };
  const auto off = run(false), on = run(true);
  EXPECT_TRUE(same(run(false), off));
  for (int64_t part : {int64_t(0), T}) {  // the prompt's rows, then the decode row
    const int64_t n = part == 0 ? T * V : V;
    std::vector<double> d;
    double ss = 0;
    for (int64_t i = part * V; i < part * V + n; ++i) {
      d.push_back(std::fabs(double(on[size_t(i)]) - off[size_t(i)]));
      ss += double(off[size_t(i)]) * off[size_t(i)];
    }
    std::nth_element(d.begin(), d.begin() + std::ptrdiff_t(d.size() / 2), d.end());
    const double med = d[d.size() / 2], rms = std::sqrt(ss / double(n));
    EXPECT_GT(*std::max_element(d.begin(), d.end()), 0.0) << (part ? "decode" : "prompt");
    EXPECT_LT(med, 1e-2 * rms) << (part ? "decode" : "prompt");
  }
}
