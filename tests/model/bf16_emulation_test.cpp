// The CPU emulation of the CUDA backend's bf16-operand prompt GEMMs (backend/cpu/bf16_emulation.h) against
// plain references at awkward sizes, and its wiring through the CPU backend (CpuOptions::emulate_bf16): each
// product class reaches its products, steps below emulate_bf16_rows rows (decode) are untouched, and the mask
// off leaves every logit as it was.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/bf16_emulation.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
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

TEST(Bf16Emulation, OptionsByName) {
  cpu::CpuOptions o;
  cpu::set_cpu_option(o, "emulate_bf16=experts,attn_out,lm_head");
  EXPECT_EQ(o.emulate_bf16, uint32_t(kProdExpertsGateUp | kProdExpertsDown | kProdAttnOut | kProdLmHead));
  cpu::set_cpu_option(o, "emulate_bf16=gpu_bf16");
  EXPECT_EQ(o.emulate_bf16, uint32_t(kProdAll & ~uint32_t(kProdRouter)));
  EXPECT_EQ(product_class_names(kProdShared | kProdGdnIn), "shared,gdn_in");
  cpu::set_cpu_option(o, "emulate_bf16_rows=7");
  EXPECT_EQ(o.emulate_bf16_rows, 7);
  for (const char* bad : {"emulate_bf16=experts,bogus", "emulate_bf16=", "emulate_bf16_rows=0", "emulate_bf16_rows=x",
                          "nosuch=1", "emulate_bf16", "affine=fp8"})
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

Prefill prefill(const std::shared_ptr<const ModelWeights>& w, uint32_t mask, int64_t T, int64_t min_rows = 33) {
  cpu::CpuOptions o;
  o.affine = cpu::AffinePath::Exact;
  o.emulate_bf16 = mask;
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

// Every class the model has moves the logits of a 40-row step when emulated alone; a 32-row step (below the
// default emulate_bf16_rows) and the mask off give the float32 logits bit for bit; lm_head alone gives
// exactly the emulated product of the final-normed residual.
TEST(Bf16Emulation, ClassesReachTheirProducts) {
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
  for (const Case& c : cases) {
    const std::string dir = test::golden_dir(c.model);
    if (dir.empty()) continue;
    SCOPED_TRACE(c.model);
    auto w = ModelWeights::load(dir);
    const Prefill off = prefill(w, 0, 40);
    EXPECT_TRUE(same(prefill(w, kProdAll, 32).logits, prefill(w, 0, 32).logits)) << "a 32-row step changed";
    EXPECT_TRUE(same(prefill(w, kProdAll, 40, 41).logits, off.logits)) << "below emulate_bf16_rows changed";
    for (uint32_t cls : c.classes) EXPECT_FALSE(same(prefill(w, cls, 40).logits, off.logits)) << product_class_names(cls);
    // a class the model lacks changes nothing
    const uint32_t absent = w->cfg.n_experts > 0 ? kProdMlp : kProdExpertsGateUp | kProdRouter;
    EXPECT_TRUE(same(prefill(w, absent | kProdMtpFc, 40).logits, off.logits));
    const Prefill head = prefill(w, kProdLmHead, 40);
    EXPECT_TRUE(same(head.residual, off.residual));
    const int64_t H = w->cfg.hidden;
    std::vector<float> h(size_t(40 * H)), want(head.logits.size());
    cpu::rms_norm(head.residual.data(), w->final_norm.data(), 40, H, float(w->cfg.rms_eps), h.data());
    cpu::matmul_bf16_operands(w->lm_head, h.data(), 40, want.data());
    EXPECT_TRUE(same(head.logits, want));
  }
}
