// The whole model on the CUDA backend against HF transformers' float32 reference logits
// (tests/data/golden, ../shared/golden or the folders of $LILY_GOLDEN_EXTRA): prompt logits, chunked prefill,
// teacher-forced decode through the captured graphs, greedy decoding, snapshots restored into another slot.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaModel, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "../model/test_util.h"
#include "cuda_compare.h"
#include "model/qwen_hybrid.h"
#include "model/weights.h"
#include "tools/eval.h"
#include "tools/quantize.h"

namespace fs = std::filesystem;
using namespace lily;

namespace {

struct ModelGolden {
  std::vector<int32_t> prompt, greedy;
  int64_t greedy_prompt_len = 0;
  std::vector<float> logits;
};

ModelGolden read_golden(const std::string& dir) {
  ModelGolden g;
  std::ifstream jf(dir + "/golden.json");
  std::stringstream ss;
  ss << jf.rdbuf();
  auto j = nlohmann::json::parse(ss.str());
  g.prompt = j["prompt_ids"].get<std::vector<int32_t>>();
  g.greedy = j["greedy_ids"].get<std::vector<int32_t>>();
  g.greedy_prompt_len = j["greedy_prompt_len"].get<int64_t>();
  std::ifstream f(dir + "/golden_logits.f32", std::ios::binary | std::ios::ate);
  g.logits.resize(size_t(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(g.logits.data()), std::streamsize(g.logits.size() * 4));
  return g;
}

int64_t argmax(const float* p, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] > p[b]) b = i;
  return b;
}

struct Compare {
  double top1 = 0, max_abs = 0, rms_ref = 0;
};
Compare compare(const float* ours, const float* ref, int64_t rows, int64_t V) {
  Compare c;
  int64_t agree = 0;
  double ss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    agree += argmax(ours + r * V, V) == argmax(ref + r * V, V);
    for (int64_t v = 0; v < V; ++v) {
      const double d = std::abs(double(ours[r * V + v]) - ref[r * V + v]);
      c.max_abs = std::isfinite(ours[r * V + v]) ? std::max(c.max_abs, d) : INFINITY;
      ss += double(ref[r * V + v]) * ref[r * V + v];
    }
  }
  c.top1 = double(agree) / double(rows);
  c.rms_ref = std::sqrt(ss / double(rows * V));
  return c;
}

class CudaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGolden, MatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = test::golden_dir(GetParam());
  if (dir.empty()) GTEST_SKIP() << GetParam() << " not present";
  auto w = ModelWeights::load(dir);
  auto g = read_golden(dir);
  const int64_t T = int64_t(g.prompt.size()), V = w->cfg.vocab;
  auto be = make_cuda_backend(w, cudatest::high_precision_options());  // fp32-class bounds: the split mode
  auto st = be->new_state(T + 64);
  std::vector<float> logits(size_t(T * V));

  // 1. the whole prompt in one step (chunked delta rule, GEMM paths)
  forward_step(*be, *st, g.prompt, T, logits.data());
  Compare c = compare(logits.data(), g.logits.data(), T, V);
  EXPECT_GE(c.top1, 0.995) << "prompt top-1";
  EXPECT_LT(c.max_abs, 2e-2 * std::max(1.0, c.rms_ref)) << "prompt max |Δlogit|";
  const double ppl_ref = cudatest::perplexity(g.logits.data(), g.prompt, V);
  const double ppl_prompt = cudatest::perplexity(logits.data(), g.prompt, V);
  EXPECT_LT(std::abs(ppl_prompt / ppl_ref - 1), 5e-4) << "prompt perplexity " << ppl_prompt << " vs " << ppl_ref;
  std::printf("[%s] prompt: top-1 %.4f, max|Δ| %.3g (ref RMS %.3g), perplexity %.6g vs reference %.6g\n",
              GetParam().c_str(), c.top1, c.max_abs, c.rms_ref, ppl_prompt, ppl_ref);

  // 2. two steps of 64 + 86 rows (state carried into the second)
  st->reset();
  forward_step(*be, *st, std::span(g.prompt).first(64), 0, nullptr);
  forward_step(*be, *st, std::span(g.prompt).subspan(64), T - 64, logits.data() + 64 * V);
  c = compare(logits.data() + 64 * V, g.logits.data() + 64 * V, T - 64, V);
  EXPECT_GE(c.top1, 0.995) << "continued prompt top-1";
  EXPECT_LT(c.max_abs, 2e-2 * std::max(1.0, c.rms_ref));

  // 3. teacher-forced decode, one token per step (graph replays across context buckets)
  st->reset();
  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t t = 0; t < T; ++t) {
    forward_step(*be, *st, std::span(g.prompt).subspan(size_t(t), 1), 1, row.data());
    std::copy(row.begin(), row.end(), logits.begin() + t * V);
  }
  c = compare(logits.data(), g.logits.data(), T, V);
  EXPECT_GE(c.top1, 0.995) << "decode top-1";
  EXPECT_LT(c.max_abs, 2e-2 * std::max(1.0, c.rms_ref));
  const double ppl_decode = cudatest::perplexity(logits.data(), g.prompt, V);
  EXPECT_LT(std::abs(ppl_decode / ppl_ref - 1), 5e-4) << "decode perplexity " << ppl_decode << " vs " << ppl_ref;
  std::printf("[%s] decode: top-1 %.4f, max|Δ| %.3g, perplexity %.6g\n", GetParam().c_str(), c.top1, c.max_abs, ppl_decode);

  // 4. greedy: prompt of greedy_prompt_len, then host-side argmax through forward_step
  const int64_t P = g.greedy_prompt_len, n = int64_t(g.greedy.size());
  st->reset();
  forward_step(*be, *st, std::span(g.prompt).first(size_t(P)), 1, row.data());
  auto snap = st->snapshot();
  std::vector<int32_t> ids{int32_t(argmax(row.data(), V))};
  while (int64_t(ids.size()) < n) {
    forward_step(*be, *st, std::span(ids).last(1), 1, row.data());
    ids.push_back(int32_t(argmax(row.data(), V)));
  }
  EXPECT_EQ(ids, g.greedy) << "greedy (host argmax)";

  // 5. the same continuation from the snapshot restored into another slot (graphs replayed there)
  EXPECT_EQ(snap->n_tokens(), P);
  auto st2 = be->new_state(T + 64);
  st2->restore(*snap);
  EXPECT_EQ(st2->n_tokens(), P);
  std::vector<int32_t> again{g.greedy[0]};
  while (int64_t(again.size()) < n) {
    forward_step(*be, *st2, std::span(again).last(1), 1, row.data());
    again.push_back(int32_t(argmax(row.data(), V)));
  }
  EXPECT_EQ(again, g.greedy) << "greedy after restore";
  EXPECT_GT(be->peak_memory(), size_t(0));
}

// The golden checkpoint (bf16) on both backends: teacher-forced agreement, perplexity and 64 greedy tokens
// (the reference holds 24).
TEST_P(CudaGolden, MatchesCpuBackend) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = test::golden_dir(GetParam());
  if (dir.empty()) GTEST_SKIP() << GetParam() << " not present";
  auto w = ModelWeights::load(dir);
  cudatest::compare_backends(w, read_golden(dir).prompt, GetParam().c_str(), {}, 64);
}

INSTANTIATE_TEST_SUITE_P(ModelGolden, CudaGolden,
                         ::testing::Values("qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_moe_text-r",
                                           "qwen3_5_text-a-mtp"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& ch : s) if (ch == '-') ch = '_';
                           return s;
                         });

// A golden model quantized to MLX affine (4 and 8 bit, group 64): the CUDA backend, reading the packed
// weights, against the CPU backend on the same quantized checkpoint (cuda_compare.h: teacher-forced
// prompt and decode logits, perplexity, 64 greedy tokens).
TEST_P(CudaGolden, AffineMatchesCpuBackend) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = test::golden_dir(GetParam());
  if (dir.empty()) GTEST_SKIP() << GetParam() << " not present";
  for (int bits : {4, 8}) {
    const fs::path out = fs::temp_directory_path() / ("lily-cuda-affine-" + GetParam() + "-" + std::to_string(bits));
    fs::remove_all(out);
    QuantizeOptions qo;
    qo.model_dir = dir; qo.out_dir = out.string(); qo.format = "affine"; qo.bits = bits; qo.group_size = 64;
    qo.progress = false;
    quantize_model(qo);
    auto w = ModelWeights::load(out.string());
    // The CUDA affine kernels take float activations: the CPU reference is the exact path, not int8.
    cpu::CpuOptions copt;
    copt.affine = cpu::AffinePath::Exact;
    const std::string what = GetParam() + " affine " + std::to_string(bits) + "-bit";
    cudatest::compare_backends(w, read_golden(dir).prompt, what.c_str(), copt, 64);
    fs::remove_all(out);
  }
}

// The bf16 prompt precision (`--precision bf16`) against HF transformers 5.17 running the golden model in bf16
// against its own float32 reference on the H200 (150 teacher-forced rows; the table, and
// scripts/device/fidelity.py for the -mtp models' main logits): mean KL(reference ‖ bf16) and top-1 flips.
// Held: no worse than HF bf16 on both. The bar for making it the default (KL at most a quarter of HF's,
// ppl within 0.05%) is printed, not held: on the H200 it failed on every golden model (bench/RESULTS.md), so the
// split mode stays the default. Decode rows run the GEMVs and must not depend on the mode.
struct HfBf16 {
  const char* name;
  double kl;
  int flips;
  friend void PrintTo(const HfBf16& h, std::ostream* os) { *os << h.name; }
};
class CudaGoldenBf16 : public ::testing::TestWithParam<HfBf16> {};

TEST_P(CudaGoldenBf16, Bf16PrecisionNoWorseThanHfBf16) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const HfBf16 hf = GetParam();
  const std::string dir = test::golden_dir(hf.name);
  if (dir.empty()) GTEST_SKIP() << hf.name << " not present";
  ASSERT_EQ(CudaOptions{}.kernels.gemm_prec, cuda::GemmPrec::kSplit) << "the split mode is the default";
  auto w = ModelWeights::load(dir);
  auto g = read_golden(dir);
  const int64_t T = int64_t(g.prompt.size()), V = w->cfg.vocab;
  CudaOptions bo;
  bo.kernels.gemm_prec = cuda::GemmPrec::kBf16;
  auto be = make_cuda_backend(w, bo);
  auto st = be->new_state(T + 8);
  std::vector<float> logits(size_t(T * V));
  forward_step(*be, *st, g.prompt, T, logits.data());
  EvalAccumulator acc;
  acc.add(logits.data(), g.logits.data(), T, V, nullptr);
  const EvalResult r = acc.result();
  const int flips = int(T - std::llround(r.top1_agreement * double(T)));
  const double ppl_ref = cudatest::perplexity(g.logits.data(), g.prompt, V);
  const double ppl = cudatest::perplexity(logits.data(), g.prompt, V);
  EXPECT_LE(r.kl_mean, hf.kl) << hf.name << ": mean KL to the float32 reference (HF bf16: " << hf.kl << ")";
  EXPECT_LE(flips, hf.flips) << hf.name << ": top-1 flips (HF bf16: " << hf.flips << ")";
  const bool bar = r.kl_mean <= hf.kl / 4 && flips <= hf.flips && std::abs(ppl / ppl_ref - 1) < 5e-4;
  std::printf("[%s] bf16 precision, prompt: mean KL %.3g (HF bf16 %.3g, the default's bar %.3g), p99 %.3g, top-1 flips "
              "%d / %lld (HF bf16 %d), perplexity %.6g vs reference %.6g (%+.2e): issue bar %s\n",
              hf.name, r.kl_mean, hf.kl, hf.kl / 4, r.kl_p99, flips, (long long)T, hf.flips, ppl, ppl_ref,
              ppl / ppl_ref - 1, bar ? "met" : "not met");

  // decode rows: the same logits in both precisions (GEMV paths)
  auto hi = make_cuda_backend(w);
  const int64_t n = std::min<int64_t>(T, 24);
  std::vector<float> a(size_t(n * V)), b(size_t(n * V));
  for (int pass = 0; pass < 2; ++pass) {
    Backend& bk = pass == 0 ? *be : *hi;
    auto s = bk.new_state(n + 8);
    for (int64_t t = 0; t < n; ++t)
      forward_step(bk, *s, std::span(g.prompt).subspan(size_t(t), 1), 1, (pass == 0 ? a : b).data() + t * V);
  }
  const cudatest::Agreement d = cudatest::agreement(a.data(), b.data(), n, V);
  EXPECT_LE(d.max_abs, 1e-5 * std::max(1.0, d.rms)) << hf.name << ": decode rows differ between the precisions";
}

INSTANTIATE_TEST_SUITE_P(ModelGolden, CudaGoldenBf16,
                         ::testing::Values(HfBf16{"qwen3_5_moe_text-a", 6.0e-3, 7}, HfBf16{"qwen3_next-a", 3.1e-2, 20},
                                           HfBf16{"qwen3_5_moe_text-a-mtp", 1.16e-2, 14},
                                           HfBf16{"qwen3_next-a-mtp", 2.15e-2, 19}),
                         [](const auto& info) {
                           std::string s = info.param.name;
                           for (auto& ch : s) if (ch == '-') ch = '_';
                           return s;
                         });

TEST(CudaModel, DescribeDecodeStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  if (dir.empty()) GTEST_SKIP() << "golden model not present";
  auto w = ModelWeights::load(dir);
  auto be = make_cuda_backend(w);
  auto ks = cuda_describe_decode_step(*be, 1000);
  ASSERT_FALSE(ks.empty());
  int per_layer[64] = {};
  for (auto& k : ks)
    if (k.layer >= 0 && k.layer < 64) ++per_layer[k.layer];
  for (int l = 0; l < int(w->cfg.layers); ++l) EXPECT_GT(per_layer[l], 0) << "layer " << l;
  EXPECT_EQ(ks.front().block, "embed");
  // four sequences of one row batched: one graph, the same blocks, each layer's mixer one launch for all
  auto k4 = cuda_describe_decode_step(*be, 1000, 4, 4);
  ASSERT_FALSE(k4.empty());
  int per4[64] = {};
  for (auto& k : k4)
    if (k.layer >= 0 && k.layer < 64) ++per4[k.layer];
  for (int l = 0; l < int(w->cfg.layers); ++l) EXPECT_GT(per4[l], 0) << "layer " << l;
  std::printf("[describe] decode step: %zu kernels alone, %zu for 4 sequences of one row\n", ks.size(), k4.size());
  EXPECT_LT(k4.size(), 2 * ks.size()) << "batched sequences share the launches";
}

}  // namespace
#endif
