// The per-class bf16 and fp16 prompt precisions (`--precision bf16|fp16 --cuda-opt classes=...`, KernelSwitches::
// reduced_classes) against their CPU emulation (CpuOptions::emulate_bf16 / emulate_fp16), and the wgmma kernels in
// the model against the mma.sync kernel, on the golden models' 150-row prompts.
//
// What can be held at the level of a model's logits: two computations with the same operand roundings but
// different fp32 summation orders do not give the same logits. Each product's inputs differ in their last fp32
// bits, which moves some of them across a bf16 / fp16 rounding boundary, and those whole-ulp changes feed the
// next products: measured on the CPU (the emulation against itself with every product's sums reversed,
// CpuOptions::emulate_k_order), the median |Δ| is 0.06-0.53 of the distance to the float32 logits on the
// goldens (0.7 where a near-tied routing decision flips), the split mode's 1.5-2.6e-5. So the device is held to
// the emulation's own spread under a reordering (the larger of two orders, reversed and from the middle round,
// so that a near tie one of them flips counts; a factor 3 for the device's other orders: attention, DeltaNet,
// norms; run 2: 1.1-2.3 against the reversed order alone), and its distance to fp32 to the emulation's within the
// factor a near-tied routing flip makes (2x seen): what catches a precision not applied or a class in the wrong
// type. The GEMM tests (test_cuda_gemm.cpp) hold each product's arithmetic to its rounding bound.
//
// The emulation does what the device does outside the chosen classes too: the other classes' products in the
// split mode (CpuOptions::emulate_split) and the KV cache in bf16 (emulate_bf16_kv). The device's tensor-core
// prompt attention (bf16 Q and P) is not emulated: the comparison runs its SIMT attention (fp32 arithmetic on the
// cached keys and values); the device's own figures (tensor-core attention against the same emulation) are
// printed beside them.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaBf16Classes, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <filesystem>
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
#include "tools/quantize.h"

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
struct ClassGolden {
  std::shared_ptr<const ModelWeights> w;
  std::vector<int32_t> ids;
  int64_t V = 0;
  std::vector<float> ref;
};
// model_dir: the weights (the golden's own, or a quantization of it); dir: the golden (its prompt).
ClassGolden load_class_golden(const std::string& dir, const std::string& model_dir = "") {
  ClassGolden g;
  g.w = ModelWeights::load(model_dir.empty() ? dir : model_dir);
  g.ids = prompt_ids(dir);
  g.V = g.w->cfg.vocab;
  cpu::CpuOptions exact;
  exact.affine = cpu::AffinePath::Exact;  // the CUDA GEMMs take float activations
  cpu::CpuBackend f32(g.w, exact);
  g.ref = prompt_logits(f32, g.ids, g.V);
  return g;
}

#define LILY_GOLDEN_OR_SKIP(g)                                                \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";                   \
  const std::string dir_ = test::golden_dir(GetParam());                     \
  if (dir_.empty()) GTEST_SKIP() << GetParam() << " not present";            \
  const ClassGolden g = load_class_golden(dir_);                                         \
  const auto& ref = g.ref

class CudaBf16Classes : public ::testing::TestWithParam<const char*> {};

// The device's prompt attention on the SIMT kernel (fp32 arithmetic) while in scope.
struct SimtAttention {
  SimtAttention() { cuda::set_attn_prefill_simt(true); }
  ~SimtAttention() { cuda::set_attn_prefill_simt(false); }
};

std::vector<float> cuda_logits(const ClassGolden& g, cuda::GemmPrec prec, uint32_t mask, bool wgmma = false) {
  CudaOptions co;
  co.kernels.gemm_prec = prec;
  co.kernels.reduced_classes = mask;
  co.kernels.gemm_wgmma = wgmma ? cuda::kWgmmaOn : cuda::kWgmmaOff;
  auto gpu = make_cuda_backend(g.w, co);
  return prompt_logits(*gpu, g.ids, g.V);
}
// The emulation of a class choice with the rest of the device's roundings: the split mode, the bf16 KV cache;
// k_order: every product's sums in order, reversed or from the middle round (CpuOptions::emulate_k_order).
std::vector<float> cpu_logits(const ClassGolden& g, bool fp16, uint32_t mask, int k_order = 0) {
  cpu::CpuOptions eo;
  (fp16 ? eo.emulate_fp16 : eo.emulate_bf16) = mask;
  eo.emulate_split = true;
  eo.emulate_bf16_kv = true;
  eo.emulate_k_order = k_order;
  eo.affine = cpu::AffinePath::Exact;
  cpu::CpuBackend emu(g.w, eo);
  return prompt_logits(emu, g.ids, g.V);
}

// The emulation's spread under a change of summation order: the larger median |Δ| between emu (in order) and the
// same emulation reversed or from the middle round.
double reorder_spread(const ClassGolden& g, bool fp16, uint32_t mask, const std::vector<float>& emu) {
  return std::max(median_abs(emu, cpu_logits(g, fp16, mask, 1)), median_abs(emu, cpu_logits(g, fp16, mask, 2)));
}

// a and b round their operands alike and sum in different orders (header): median |Δ| `between` within 3x the
// emulation's spread under a reordering, distances to fp32 within a factor 3 of each other.
void expect_same_roundings(double between, double order, double a_f32, double b_f32) {
  EXPECT_GT(a_f32, 0.0);
  EXPECT_GT(order, 0.0);
  EXPECT_LE(between, 3 * order);
  EXPECT_LE(a_f32, 3 * b_f32);
  EXPECT_LE(b_f32, 3 * a_f32);
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
    const double order = reorder_spread(g, fp16, mask, emu);
    // as the device runs by default: tensor-core attention (not asserted)
    const auto dflt = cuda_logits(g, prec, mask);
    std::printf("[%s] %s classes=%s: median |Δ| CUDA-emulation %.3g (the emulation reordered: %.3g, x%.2f), "
                "CUDA-fp32 %.3g, emulation-fp32 %.3g; tensor-core attention: %.3g, %.3g\n",
                GetParam(), fp16 ? "fp16" : "bf16", list, to_emu, order, to_emu / order, to_f32, emu_f32,
                median_abs(dflt, emu), median_abs(dflt, ref));
    expect_same_roundings(to_emu, order, to_f32, emu_f32);
    EXPECT_LE(floor_emu, 0.25 * to_f32);
  }
}

// The wgmma kernels in the model (dense products and the MoE's 128-row expert tile maps, KernelSwitches::
// gemm_wgmma) against the mma.sync kernel in the same precision, on the golden's bf16 weights and on its affine
// 4-bit quantization (group 64). The operands are rounded alike. With bf16 weights in the bf16 mode both sum each
// k in the same order (64-deep stages of k16 slices): the logits agree far closer than either to fp32 (run 2:
// identical). The register-A kernel (affine weights, and bf16 weights in the fp16 mode) permutes k inside each
// stage (gemm_wgmma_rs.h), so there the two are held as computations in different orders (header).
class CudaWgmmaModel : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaWgmmaModel, MatchesTheMmaSyncKernel) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = test::golden_dir(GetParam());
  if (dir.empty()) GTEST_SKIP() << GetParam() << " not present";
  namespace fs = std::filesystem;
  const fs::path q4 = fs::temp_directory_path() / (std::string("lily-wgmma-affine4-") + GetParam());
  fs::remove_all(q4);
  QuantizeOptions qo;
  qo.model_dir = dir; qo.out_dir = q4.string(); qo.format = "affine"; qo.bits = 4; qo.group_size = 64;
  qo.progress = false;
  quantize_model(qo);
  for (bool affine : {false, true}) {
    const ClassGolden g = load_class_golden(dir, affine ? q4.string() : "");
    const auto& ref = g.ref;
    for (cuda::GemmPrec prec : {cuda::GemmPrec::kBf16, cuda::GemmPrec::kFp16}) {
      const bool fp16 = prec == cuda::GemmPrec::kFp16;
      const std::string what = std::string(affine ? "affine4 " : "bf16 weights ") + (fp16 ? "fp16" : "bf16");
      SCOPED_TRACE(what);
      const uint32_t mask = cuda::KernelSwitches{}.reduced_classes;
      const std::vector<float> l[2] = {cuda_logits(g, prec, mask, false), cuda_logits(g, prec, mask, true)};
      const double between = median_abs(l[0], l[1]), mma_f32 = median_abs(l[0], ref), wg_f32 = median_abs(l[1], ref);
      const bool same_order = !affine && !fp16;
      const double order = same_order ? 0.0 : reorder_spread(g, fp16, mask, cpu_logits(g, fp16, mask));
      std::printf("[%s] %s: median |Δ| wgmma-mma.sync %.3g (the emulation reordered: %.3g), mma.sync-fp32 %.3g, "
                  "wgmma-fp32 %.3g\n", GetParam(), what.c_str(), between, order, mma_f32, wg_f32);
      if (same_order) {
        EXPECT_GT(mma_f32, 0.0);
        EXPECT_LE(between, 0.1 * mma_f32);
      } else {
        expect_same_roundings(between, order, wg_f32, mma_f32);
      }
    }
  }
  fs::remove_all(q4);
}

const char* const kGoldens[] = {"qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_moe_text-r", "qwen3_5_text-a-mtp"};
std::string golden_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  for (auto& ch : s)
    if (ch == '-') ch = '_';
  return s;
}
INSTANTIATE_TEST_SUITE_P(ClassGolden, CudaWgmmaModel, ::testing::ValuesIn(kGoldens), golden_name);
INSTANTIATE_TEST_SUITE_P(ClassGolden, CudaBf16Classes, ::testing::ValuesIn(kGoldens), golden_name);

}  // namespace
#endif
