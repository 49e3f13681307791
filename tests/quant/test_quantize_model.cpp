// Quantize the golden models both ways, load and run them, and measure fidelity against the float model:
// KL must order EXL3 K2 > K3 > K4 > K5, and EXL3 K4 must beat MLX affine 4-bit g64 (fewer bits per weight).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/cpu/matmul.h"
#include "backend/cpu/mtp_reference.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/weights.h"
#include "runtime/engine.h"
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

namespace {

// The MTP block of `dir` over the golden prompt, fed the float model's post-norm states: h' [T-1, H] and
// logits [T-1, V]. Isolates the block's own weights from the main model's quantization.
struct MtpRun {
  std::vector<float> h, logits;
};
MtpRun mtp_run(const std::string& dir, const std::string& float_dir, const std::vector<int32_t>& ids) {
  EngineOptions eo;
  eo.ctx_size = int64_t(ids.size());
  auto ref = Engine::open(float_dir, eo);
  auto& be = dynamic_cast<cpu::CpuBackend&>(ref->backend());
  auto st = be.new_state(eo.ctx_size);
  auto hidden = cpu::final_hidden_states(be, *st, ids, 0, nullptr);
  auto w = ModelWeights::load(dir);
  cpu::MtpReference m(*w);
  const size_t T = ids.size() - 1;
  MtpRun r{std::vector<float>(T * size_t(w->cfg.hidden)), std::vector<float>(T * size_t(w->cfg.vocab))};
  m.step(std::span<const int32_t>(ids).subspan(1), hidden.data(), r.h.data(), r.logits.data());
  return r;
}

double top1(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  int64_t same = 0, T = int64_t(a.size()) / V;
  for (int64_t t = 0; t < T; ++t)
    same += std::max_element(a.begin() + t * V, a.begin() + (t + 1) * V) - (a.begin() + t * V) ==
            std::max_element(b.begin() + t * V, b.begin() + (t + 1) * V) - (b.begin() + t * V);
  return double(same) / double(T);
}

}  // namespace

// The MTP block is quantized like the layers (its fused experts stacked as mlx-lm does), or kept
// bit-exact with keep_mtp; calibration captures its Hessians too. (EXL3 takes the same plan; a whole EXL3
// quantization of a golden model costs ~40 s of CPU, so it is measured by hand: K4 + LDLQ of
// qwen3_next-a-mtp gives MTP top-1 agreement 0.893 with the bf16 block. Loading EXL3 MTP blocks is
// covered by the synth EXL3 models.)
TEST(QuantizeModel, MtpBlock) {
  cpu::set_affine_path_default(cpu::AffinePath::Exact);
  const std::string m = "qwen3_5_moe_text-a-mtp";
  auto ids = prompt_ids(m);
  const auto ref = mtp_run(golden(m), golden(m), ids);
  const int64_t V = 320;
  QuantizeOptions o;
  o.model_dir = golden(m);
  o.out_dir = tmpdir("mtp_aff8");
  o.format = "affine";
  o.bits = 8;
  o.progress = false;
  quantize_model(o);
  {
    auto w = ModelWeights::load(o.out_dir);
    ASSERT_TRUE(w->mtp);
    EXPECT_TRUE(w->ckpt->find("mtp.layers.0.mlp.switch_mlp.gate_proj.weight"));
    EXPECT_EQ(w->mtp->fc.format, WeightFormat::Affine);
    EXPECT_EQ(w->mtp->layer.attn.q.format, WeightFormat::Affine);
    EXPECT_EQ(w->mtp->layer.ffn.experts[5].down.format, WeightFormat::Affine);
    EXPECT_EQ(w->mtp->layer.ffn.router.affine->bits, 8);
    auto q = mtp_run(o.out_dir, golden(m), ids);
    const double agree = top1(q.logits, ref.logits, V);
    std::printf("MTP affine 8-bit: top-1 agreement with bf16 %.3f\n", agree);
    EXPECT_GT(agree, 0.9);
  }
  fs::remove_all(o.out_dir);
  cpu::set_affine_path_default(cpu::AffinePath::Int8);
  o.bits = 4;
  o.keep_mtp = true;
  quantize_model(o);
  {
    auto w = ModelWeights::load(o.out_dir);
    auto f = ModelWeights::load(golden(m));
    ASSERT_TRUE(w->mtp);
    EXPECT_EQ(w->layers[3].attn.q.format, WeightFormat::Affine);
    const MtpWeights &a = *w->mtp, &b = *f->mtp;
    for (auto [x, y] : {std::pair{&a.fc, &b.fc}, {&a.layer.attn.q, &b.layer.attn.q}, {&a.layer.ffn.router, &b.layer.ffn.router},
                        {&a.layer.ffn.experts[5].down, &b.layer.ffn.experts[5].down}}) {
      ASSERT_EQ(x->format, WeightFormat::Dense) << x->name;
      std::vector<float> rx(static_cast<size_t>(x->in)), ry(static_cast<size_t>(y->in));
      for (int64_t r = 0; r < x->out; ++r) {
        cpu::weight_row(*x, r, rx.data());
        cpu::weight_row(*y, r, ry.data());
        ASSERT_EQ(rx, ry) << x->name << " row " << r;
      }
    }
    EXPECT_EQ(a.norm_hidden, b.norm_hidden);
    EXPECT_EQ(a.layer.post_norm, b.layer.post_norm);
  }
  fs::remove_all(o.out_dir);

  const std::string n = "qwen3_next-a-mtp", f = tmpdir("mtp_cal_ids.txt");
  {
    std::ofstream os(f);
    for (auto t : prompt_ids(n)) os << t << " ";
  }
  auto H = capture_hessians(golden(n), f, 1000, {"mtp.fc", "mtp.layers.0.self_attn.q_proj"});
  fs::remove(f);
  ASSERT_EQ(H["mtp.fc"].size(), size_t(256 * 256));
  EXPECT_EQ(H["mtp.layers.0.self_attn.q_proj"].size(), size_t(128 * 128));
  // fc reads [norm(e) ‖ norm(h)]: both halves are RMS-normed rows, so every diagonal entry is positive
  for (int i = 0; i < 256; ++i) EXPECT_GT(H["mtp.fc"][size_t(i * 257)], 0.0) << i;
}

// The dense Qwen3.5 golden in every format lily quantizes to: the dense MLP (and everything else the
// formats quantize) loads in the format, runs, and stays close to the bf16 model. The checkpoint carries
// an MTP block (mtp.*, a dense MLP in its layer), quantized with the rest. Bounds as for the MoE goldens: these random models
// amplify noise, 8-bit affine already moves KL to a few thousandths. The released models tie lm_head to
// the embedding, so the golden is also re-saved tied: affine then keeps one quantized table (mlx-lm's
// embed_tokens.as_linear), EXL3 the embedding in 16 bits and a quantized lm_head copy (as exllamav3 does).
TEST(QuantizeModel, DenseQwen35EveryFormat) {
  const std::string m = "qwen3_5_text-a-mtp";
  const std::string tied = tmpdir("dense_tied");
  {
    fs::create_directories(tied);
    Checkpoint ck(golden(m));
    std::vector<TensorToWrite> t;
    for (auto& [name, ti] : ck.tensors())
      if (name != "lm_head.weight") t.push_back({name, ti->dtype, ti->shape, ti->data, ti->nbytes});
    write_safetensors(tied + "/model.safetensors", t);
    auto cfg = nlohmann::json::parse(read_text_file(golden(m) + "/config.json"));
    cfg["tie_word_embeddings"] = true;
    std::ofstream(tied + "/config.json") << cfg.dump(1);
  }
  struct Case {
    const char* tag;
    const char* format;
    double bits;
    bool tied;
    double max_kl, min_top1;
    WeightFormat want;
  };
  for (const Case& c : {Case{"affine8", "affine", 8, false, 0.02, 0.7, WeightFormat::Affine},
                        Case{"affine4", "affine", 4, false, 0.5, 0.15, WeightFormat::Affine},
                        Case{"affine4-tied", "affine", 4, true, 0.5, 0.15, WeightFormat::Affine},
                        Case{"exl3-K4-tied", "exl3", 4, true, 0.25, 0.3, WeightFormat::Exl3}}) {
    const std::string ref = c.tied ? tied : golden(m);
    QuantizeOptions o;
    o.model_dir = ref;
    o.out_dir = tmpdir(m + "_" + c.tag);
    o.format = c.format;
    o.bits = c.bits;
    o.progress = false;
    quantize_model(o);
    auto w = ModelWeights::load(o.out_dir);
    EXPECT_EQ(w->cfg.arch, Arch::Qwen35);
    for (const auto& L : w->layers) {
      ASSERT_FALSE(L.ffn.moe);
      EXPECT_EQ(L.ffn.shared.gate.format, c.want) << c.tag;
      EXPECT_EQ(L.ffn.shared.up.format, c.want) << c.tag;
      EXPECT_EQ(L.ffn.shared.down.format, c.want) << c.tag;
    }
    if (c.tied && c.want == WeightFormat::Affine) {
      EXPECT_EQ(w->embed.format, WeightFormat::Affine);
      EXPECT_TRUE(w->lm_head.same_storage(w->embed));
      EXPECT_FALSE(w->ckpt->find("lm_head.weight"));
    }
    if (c.tied && c.want == WeightFormat::Exl3) {
      EXPECT_EQ(w->embed.format, WeightFormat::Dense);
      EXPECT_EQ(w->lm_head.format, WeightFormat::Exl3);
      EXPECT_TRUE(w->ckpt->find("lm_head.trellis"));
    }
    // Formats are compared on their weights alone (see KlOrderingExl3VsAffine).
    cpu::set_affine_path_default(cpu::AffinePath::Exact);
    auto r = eval_models(o.out_dir, ref, prompt_ids(m));
    cpu::set_affine_path_default(cpu::AffinePath::Int8);
    std::printf("%s %-12s KL mean %.4f p99 %.4f top1 %.3f ppl %.2f (ref %.2f)\n", m.c_str(), c.tag, r.kl_mean, r.kl_p99,
                r.top1_agreement, r.ppl_model, r.ppl_reference);
    EXPECT_TRUE(std::isfinite(r.kl_mean)) << c.tag;
    EXPECT_LT(r.kl_mean, c.max_kl) << c.tag;
    EXPECT_GT(r.top1_agreement, c.min_top1) << c.tag;
    fs::remove_all(o.out_dir);
  }
  fs::remove_all(tied);
}
