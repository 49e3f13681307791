// The per-class bf16 and fp16 prompt precisions (`--precision bf16|fp16 --cuda-opt classes=...`, KernelSwitches::
// reduced_classes) against their CPU emulation (CpuOptions::emulate_bf16 / emulate_fp16), on the golden models'
// 150-row prompts: the CUDA logits must sit much closer to the emulation of the same class choice than to the
// float32 CPU logits (median |Δ| at most a quarter), which is what makes the CPU measurements of a choice
// (scripts/fidelity_cpu.py, bench/RESULTS.md) stand for the device's GEMMs. The emulation must then do what the
// device does outside the chosen classes too, or those roundings decorrelate which operands of the chosen classes
// round up or down on the two sides (measured on the CPU: up to half the distance to fp32): the other classes'
// products in the split mode (CpuOptions::emulate_split) and the KV cache in bf16 (emulate_bf16_kv). The device's
// tensor-core prompt attention (bf16 Q and P) is not emulated: the comparison runs its SIMT attention (fp32
// arithmetic on the cached keys and values). The two sides then differ by the order of the fp32 additions. The
// device's own figures (tensor-core attention against the same emulation) are printed beside them.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaBf16Classes, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/attn_prefill.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/product_class.h"
#include "../model/test_util.h"
#include "model/qwen_hybrid.h"
#include "model/weights.h"

using namespace lily;

namespace {

std::vector<int32_t> prompt_ids(const std::string& dir) {
  std::ifstream jf(dir + "/golden.json");
  std::stringstream ss;
  ss << jf.rdbuf();
  return nlohmann::json::parse(ss.str())["prompt_ids"].get<std::vector<int32_t>>();
}

std::vector<float> prompt_logits(Backend& be, const std::vector<int32_t>& ids, int64_t V) {
  auto st = be.new_state(int64_t(ids.size()) + 8);
  std::vector<float> l(ids.size() * size_t(V));
  forward_step(be, *st, ids, int64_t(ids.size()), l.data());
  return l;
}

// median |a - b| over every logit
double median_abs(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = std::abs(double(a[i]) - b[i]);
  std::nth_element(d.begin(), d.begin() + std::ptrdiff_t(d.size() / 2), d.end());
  return d[d.size() / 2];
}

// A golden model, its prompt and the float32 CPU logits of it.
struct Golden {
  std::shared_ptr<const ModelWeights> w;
  std::vector<int32_t> ids;
  int64_t V = 0;
  std::vector<float> ref;
};
Golden load_golden(const std::string& dir) {
  Golden g;
  g.w = ModelWeights::load(dir);
  g.ids = prompt_ids(dir);
  g.V = g.w->cfg.vocab;
  cpu::CpuBackend f32(g.w);
  g.ref = prompt_logits(f32, g.ids, g.V);
  return g;
}

#define LILY_GOLDEN_OR_SKIP(g)                                                \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";                   \
  const std::string dir_ = test::golden_dir(GetParam());                     \
  if (dir_.empty()) GTEST_SKIP() << GetParam() << " not present";            \
  const Golden g = load_golden(dir_);                                         \
  const auto& ref = g.ref

class CudaBf16Classes : public ::testing::TestWithParam<const char*> {};

// The device's prompt attention on the SIMT kernel (fp32 arithmetic) while in scope.
struct SimtAttention {
  SimtAttention() { cuda::set_attn_prefill_simt(true); }
  ~SimtAttention() { cuda::set_attn_prefill_simt(false); }
};

std::vector<float> cuda_logits(const Golden& g, cuda::GemmPrec prec, uint32_t mask, bool wgmma = false) {
  CudaOptions co;
  co.kernels.gemm_prec = prec;
  co.kernels.reduced_classes = mask;
  co.kernels.gemm_wgmma = wgmma ? cuda::kWgmmaOn : cuda::kWgmmaOff;
  auto gpu = make_cuda_backend(g.w, co);
  return prompt_logits(*gpu, g.ids, g.V);
}
// The emulation of a class choice with the rest of the device's roundings: the split mode, the bf16 KV cache.
std::vector<float> cpu_logits(const Golden& g, bool fp16, uint32_t mask) {
  cpu::CpuOptions eo;
  (fp16 ? eo.emulate_fp16 : eo.emulate_bf16) = mask;
  eo.emulate_split = true;
  eo.emulate_bf16_kv = true;
  cpu::CpuBackend emu(g.w, eo);
  return prompt_logits(emu, g.ids, g.V);
}

TEST_P(CudaBf16Classes, MatchesTheCpuEmulation) {
  LILY_GOLDEN_OR_SKIP(g);
  // the floor: the split mode with the SIMT attention against its emulation
  double floor_emu = 0;
  {
    SimtAttention simt;
    floor_emu = median_abs(cuda_logits(g, cuda::GemmPrec::kSplit, 0), cpu_logits(g, false, 0));
  }
  std::printf("[%s] split mode, SIMT attention: median |Δ| to its emulation %.3g\n", GetParam(), floor_emu);
  const std::pair<cuda::GemmPrec, const char*> choices[] = {
      {cuda::GemmPrec::kBf16, "attn_out,lm_head"},
      {cuda::GemmPrec::kBf16, "experts,shared,attn,gdn_out,lm_head,mlp"},
      {cuda::GemmPrec::kBf16, "gpu_bf16"},
      {cuda::GemmPrec::kFp16, "gpu_bf16"},
      {cuda::GemmPrec::kFp16, "all"}};
  for (auto [prec, list] : choices) {
    const bool fp16 = prec == cuda::GemmPrec::kFp16;
    SCOPED_TRACE(std::string(fp16 ? "fp16 " : "bf16 ") + list);
    const uint32_t mask = parse_product_classes(list, "test");
    std::vector<float> dev;
    {
      SimtAttention simt;
      dev = cuda_logits(g, prec, mask);
    }
    const auto emu = cpu_logits(g, fp16, mask);
    const double to_emu = median_abs(dev, emu), to_f32 = median_abs(dev, ref), emu_f32 = median_abs(emu, ref);
    // as the device runs by default: tensor-core attention (not asserted)
    const auto dflt = cuda_logits(g, prec, mask);
    std::printf("[%s] %s classes=%s: median |Δ| CUDA-emulation %.3g, CUDA-fp32 %.3g, emulation-fp32 %.3g; "
                "tensor-core attention: %.3g, %.3g\n",
                GetParam(), fp16 ? "fp16" : "bf16", list, to_emu, to_f32, emu_f32, median_abs(dflt, emu),
                median_abs(dflt, ref));
    EXPECT_GT(to_f32, 0.0);
    EXPECT_LE(to_emu, 0.25 * to_f32);
    EXPECT_LE(floor_emu, 0.25 * to_f32);
  }
}

// The wgmma kernel in the model (dense products and the MoE's 128-row expert tile maps, KernelSwitches::gemm_wgmma)
// against the mma.sync kernel in the same precision: the operands are rounded alike, so the two differ by the
// order of the fp32 additions only — far less than either differs from the float32 CPU logits.
class CudaWgmmaModel : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaWgmmaModel, MatchesTheMmaSyncKernel) {
  LILY_GOLDEN_OR_SKIP(g);
  for (cuda::GemmPrec prec : {cuda::GemmPrec::kBf16, cuda::GemmPrec::kFp16}) {
    const bool fp16 = prec == cuda::GemmPrec::kFp16;
    SCOPED_TRACE(fp16 ? "fp16" : "bf16");
    const uint32_t mask = cuda::KernelSwitches{}.reduced_classes;
    const std::vector<float> l[2] = {cuda_logits(g, prec, mask, false), cuda_logits(g, prec, mask, true)};
    const double between = median_abs(l[0], l[1]), to_f32 = median_abs(l[0], ref);
    std::printf("[%s] %s: median |Δ| wgmma-mma.sync %.3g, mma.sync-fp32 %.3g\n", GetParam(), fp16 ? "fp16" : "bf16",
                between, to_f32);
    EXPECT_GT(to_f32, 0.0);
    EXPECT_LE(between, 0.1 * to_f32);
  }
}

const char* const kGoldens[] = {"qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_moe_text-r", "qwen3_5_text-a-mtp"};
std::string golden_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  for (auto& ch : s)
    if (ch == '-') ch = '_';
  return s;
}
INSTANTIATE_TEST_SUITE_P(Golden, CudaWgmmaModel, ::testing::ValuesIn(kGoldens), golden_name);
INSTANTIATE_TEST_SUITE_P(Golden, CudaBf16Classes, ::testing::ValuesIn(kGoldens), golden_name);

}  // namespace
#endif
