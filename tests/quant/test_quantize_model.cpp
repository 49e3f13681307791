// Quantize the golden models both ways, load and run them, and measure fidelity against the float model:
// KL must order EXL3 K2 > K3 > K4 > K5, and EXL3 K4 must beat MLX affine 4-bit g64 (fewer bits per weight).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/weights.h"
#include "quant/affine/affine.h"
#include "tools/calibrate.h"
#include "tools/eval.h"
#include "tools/quantize.h"

namespace fs = std::filesystem;
using namespace lily;

namespace {

std::string golden(const std::string& m) { return std::string(LILY_TEST_DATA) + "/golden/" + m; }

std::string tmpdir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("lily_test_quant_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d.parent_path());
  return d.string();
}

std::vector<int32_t> prompt_ids(const std::string& model) {
  auto j = nlohmann::json::parse(read_text_file(golden(model) + "/golden.json"));
  return j["prompt_ids"].get<std::vector<int32_t>>();
}

EvalResult quantize_and_eval(const std::string& model, QuantizeOptions o, const std::string& tag) {
  o.model_dir = golden(model);
  o.out_dir = tmpdir(model + "_" + tag);
  o.progress = false;
  auto q = quantize_model(o);
  auto r = eval_models(o.out_dir, o.model_dir, prompt_ids(model));
  std::printf("%s %-10s bpw %.2f  KL mean %.5f p99 %.5f  top1 %.3f  ppl %.3f (ref %.3f)%s\n", model.c_str(),
              tag.c_str(), q.bits_per_weight, r.kl_mean, r.kl_p99, r.top1_agreement, r.ppl_model, r.ppl_reference,
              q.tiles ? fmt::format("  {} tiles {:.1f} s", q.tiles, q.seconds).c_str() : "");
  fs::remove_all(o.out_dir);
  return r;
}

}  // namespace

TEST(QuantizeModel, AffineLayoutLoadsAndRuns) {
  QuantizeOptions o;
  o.model_dir = golden("qwen3_next-a");
  o.out_dir = tmpdir("aff");
  o.format = "affine";
  o.bits = 8;
  o.progress = false;
  quantize_model(o);
  auto w = ModelWeights::load(o.out_dir);
  // mlx-lm layout: stacked experts, routers at 8 bits, tokenizer-side files copied
  EXPECT_TRUE(w->ckpt->find("model.layers.0.mlp.switch_mlp.gate_proj.weight"));
  ASSERT_EQ(w->layers[0].ffn.experts.size(), 8u);
  EXPECT_EQ(w->layers[0].ffn.experts[3].down.format, WeightFormat::Affine);
  EXPECT_EQ(w->layers[0].ffn.router.affine->bits, 8);
  EXPECT_EQ(w->layers[0].gdn.in_qkv.affine->bits, 8);
  EXPECT_EQ(w->layers[0].ffn.shared.down.format, WeightFormat::Dense);  // 96 inputs: not a multiple of 64
  EXPECT_TRUE(fs::exists(o.out_dir + "/generation_config.json"));
  // The bounds below are for the 8-bit weights' own noise, so the products run with float activations
  // (the exact path); the int8 activation path's cost is measured in test_affine_int8.cpp.
  cpu::set_affine_path_default(cpu::AffinePath::Exact);
  auto r = eval_models(o.out_dir, o.model_dir, prompt_ids("qwen3_next-a"));
  cpu::set_affine_path_default(cpu::AffinePath::Int8);
  // The golden models are random and chaotic (ppl > vocab): 8-bit noise (0.6% per matrix) already moves
  // KL to ~0.04; 4-bit g64 gives ~0.4.
  EXPECT_GT(r.top1_agreement, 0.6);
  EXPECT_LT(r.kl_mean, 0.1);
  fs::remove_all(o.out_dir);
}

TEST(QuantizeModel, RefusesBadOptions) {
  QuantizeOptions o;
  o.model_dir = golden("qwen3_next-a");
  o.out_dir = tmpdir("bad");
  o.format = "affine";
  o.bits = 7;
  EXPECT_THROW(quantize_model(o), InputError);
  o.bits = 4;
  o.group_size = 48;
  EXPECT_THROW(quantize_model(o), InputError);
  o.format = "exl3";
  o.codebook = "fancy";
  EXPECT_THROW(quantize_model(o), InputError);
  o.format = "gguf";
  EXPECT_THROW(quantize_model(o), InputError);
}

TEST(QuantizeModel, KlOrderingExl3VsAffine) {
  const std::string m = "qwen3_5_moe_text-a";
  QuantizeOptions a;
  a.format = "affine";
  a.bits = 4;
  a.group_size = 64;
  // Formats are compared on their weights alone: EXL3 runs with float activations, so affine does too
  // (the exact path; the int8 activation path's own cost is measured in test_affine_int8.cpp).
  cpu::set_affine_path_default(cpu::AffinePath::Exact);
  const double kl_aff = quantize_and_eval(m, a, "affine4").kl_mean;
  cpu::set_affine_path_default(cpu::AffinePath::Int8);
  double kl[6] = {};
  for (int K = 2; K <= 5; ++K) {
    QuantizeOptions e;
    e.format = "exl3";
    e.bits = K;
    e.codebook = "mcg";
    e.head_bits = K;  // the head at the same K, so that K alone orders the runs
    kl[K] = quantize_and_eval(m, e, "exl3-K" + std::to_string(K)).kl_mean;
  }
  EXPECT_GT(kl[2], kl[3]);
  EXPECT_GT(kl[3], kl[4]);
  EXPECT_GT(kl[4], kl[5]);
  EXPECT_LT(kl[4], kl_aff);
}

TEST(QuantizeModel, CalibrationHessians) {
  const std::string m = "qwen3_next-a";
  auto ids = prompt_ids(m);
  const std::string f = tmpdir("cal_ids.txt");
  {
    std::ofstream o(f);
    for (auto t : ids) o << t << ", ";
  }
  const std::string q = "model.layers.3.self_attn.q_proj", k = "model.layers.3.self_attn.k_proj";
  const std::string qkvz = "model.layers.0.linear_attn.in_proj_qkvz", down = "model.layers.1.mlp.experts.2.down_proj";
  auto H = capture_hessians(golden(m), f, 1000, {q, k, qkvz, down, "lm_head"});
  fs::remove(f);
  ASSERT_TRUE(H.count(q) && H.count(k) && H.count(qkvz) && H.count("lm_head"));
  const auto& hq = H[q];
  ASSERT_EQ(hq.size(), size_t(128 * 128));
  // q and k read the same normed hidden states: identical Hessians; symmetric with a positive diagonal
  EXPECT_EQ(hq, H[k]);
  for (int i = 0; i < 128; ++i) {
    EXPECT_GT(hq[size_t(i * 129)], 0.0);
    for (int j = 0; j < i; ++j) EXPECT_NEAR(hq[size_t(i * 128 + j)], hq[size_t(j * 128 + i)], 1e-9 * (1 + std::fabs(hq[size_t(i * 128 + j)])));
  }
  if (H.count(down)) {
    EXPECT_EQ(H[down].size(), size_t(64 * 64));  // an expert sees only its routed tokens
  }
}

TEST(QuantizeModel, FractionalBitsAllocation) {
  std::vector<Exl3Group> g = {{"attn", 100, 0, 0}, {"shared", 100, 1, 0}, {"down", 300, 2, 0}, {"gateup", 500, 3, 0}};
  exl3_allocate_bits(g, 3.0);
  for (auto& x : g) EXPECT_EQ(x.K, 3);
  exl3_allocate_bits(g, 3.5);  // budget 500 extra bits-per-weight units: attn, shared, down get +1
  EXPECT_EQ(g[0].K, 4);
  EXPECT_EQ(g[1].K, 4);
  EXPECT_EQ(g[2].K, 4);
  EXPECT_EQ(g[3].K, 3);
  double avg = 0;
  for (auto& x : g) avg += x.weights * x.K / 1000.0;
  EXPECT_LE(avg, 3.5 + 1e-9);
  exl3_allocate_bits(g, 3.6);  // gate/up does not fit: the average never exceeds the request
  EXPECT_EQ(g[3].K, 3);
  exl3_allocate_bits(g, 8.0);
  for (auto& x : g) EXPECT_EQ(x.K, 8);
  EXPECT_THROW(exl3_allocate_bits(g, 0.5), InputError);
  EXPECT_THROW(exl3_allocate_bits(g, 9), InputError);
}
