// Synthetic models: the in-memory builder and the on-disk writer give the same model (same weights,
// same logits), every format loads, the router spreads over all experts; lily bench runs and reports.
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cpu/matmul.h"
#include "backend/cpu/mtp_reference.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "tools/bench.h"
#include "tools/synth.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

std::string tmp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("lily_tools_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  return d.string();
}

void expect_same_rows(const Linear& a, const Linear& b) {
  ASSERT_EQ(a.out, b.out) << a.name;
  ASSERT_EQ(a.in, b.in) << a.name;
  ASSERT_EQ(int(a.format), int(b.format)) << a.name;
  std::vector<float> ra(static_cast<size_t>(a.in)), rb(static_cast<size_t>(b.in));
  for (int64_t r : {int64_t(0), a.out / 2, a.out - 1}) {
    cpu::weight_row(a, r, ra.data());
    cpu::weight_row(b, r, rb.data());
    for (int64_t i = 0; i < a.in; ++i) ASSERT_EQ(ra[size_t(i)], rb[size_t(i)]) << a.name << " row " << r << " col " << i;
  }
}

std::vector<float> logits_of(std::shared_ptr<const ModelWeights> w, const std::vector<int32_t>& ids) {
  EngineOptions eo;
  eo.ctx_size = 256;
  eo.prefill_chunk = 16;
  auto e = Engine::from_weights(w, eo);
  Session s(*e);
  std::vector<float> all(ids.size() * size_t(w->cfg.vocab));
  s.prefill(ids, nullptr, all.data());
  return all;
}

class SynthFormats : public ::testing::TestWithParam<std::tuple<std::string, SynthFormat>> {};

TEST_P(SynthFormats, MemoryAndDiskAreTheSameModel) {
  SynthOptions o;
  o.preset = std::get<0>(GetParam());
  o.format = std::get<1>(GetParam());
  o.seed = 5;
  auto mem = synth_model(o);
  const std::string dir = tmp_dir(o.preset + "-" + synth_format_name(o.format));
  auto res = write_synth(o, dir);
  EXPECT_EQ(res.shards, 6);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  auto disk = ModelWeights::load(dir);
  EXPECT_EQ(mem->cfg.layers, disk->cfg.layers);
  EXPECT_EQ(mem->rope_inv_freq, disk->rope_inv_freq);
  EXPECT_EQ(mem->weight_bytes(), disk->weight_bytes());
  EXPECT_EQ(mem->active_bytes_per_token(), disk->active_bytes_per_token());
  expect_same_rows(mem->embed, disk->embed);
  expect_same_rows(mem->lm_head, disk->lm_head);
  EXPECT_EQ(mem->final_norm, disk->final_norm);
  for (size_t i = 0; i < mem->layers.size(); ++i) {
    const auto& a = mem->layers[i];
    const auto& b = disk->layers[i];
    EXPECT_EQ(a.input_norm, b.input_norm);
    if (a.kind == LayerKind::LinearAttention) {
      expect_same_rows(a.gdn.in_qkv, b.gdn.in_qkv);
      expect_same_rows(a.gdn.in_b, b.gdn.in_b);
      expect_same_rows(a.gdn.out, b.gdn.out);
      EXPECT_EQ(a.gdn.conv, b.gdn.conv);
      EXPECT_EQ(a.gdn.A_neg, b.gdn.A_neg);
    } else {
      expect_same_rows(a.attn.q, b.attn.q);
      EXPECT_EQ(a.attn.k_norm, b.attn.k_norm);
    }
    ASSERT_EQ(a.ffn.moe, b.ffn.moe);
    if (a.ffn.moe) {
      expect_same_rows(a.ffn.router, b.ffn.router);
      expect_same_rows(a.ffn.experts.back().down, b.ffn.experts.back().down);
      expect_same_rows(a.ffn.shared_gate, b.ffn.shared_gate);
    } else {  // the dense MLP
      EXPECT_TRUE(b.ffn.experts.empty());
      expect_same_rows(a.ffn.shared.gate, b.ffn.shared.gate);
      expect_same_rows(a.ffn.shared.down, b.ffn.shared.down);
    }
  }
  // The MTP block, drawn in the same format as the layers (with the dense MLP in a dense model).
  ASSERT_TRUE(mem->mtp && disk->mtp);
  EXPECT_EQ(mem->mtp_weight_bytes(), disk->mtp_weight_bytes());
  const Linear& mlp0 = disk->layers[0].ffn.moe ? disk->layers[0].ffn.experts[0].gate : disk->layers[0].ffn.shared.gate;
  EXPECT_EQ(int(disk->mtp->fc.format), int(mlp0.format));
  expect_same_rows(mem->mtp->fc, disk->mtp->fc);
  expect_same_rows(mem->mtp->layer.attn.q, disk->mtp->layer.attn.q);
  if (mem->mtp->layer.ffn.moe)
    expect_same_rows(mem->mtp->layer.ffn.experts.back().up, disk->mtp->layer.ffn.experts.back().up);
  else
    expect_same_rows(mem->mtp->layer.ffn.shared.up, disk->mtp->layer.ffn.shared.up);
  EXPECT_EQ(mem->mtp->norm_hidden, disk->mtp->norm_hidden);
  EXPECT_EQ(mem->mtp->final_norm, disk->mtp->final_norm);
  // Tied presets keep one table (EXL3: a quantized lm_head beside the 16-bit embedding, as exllamav3 does).
  const bool tied_table = mem->cfg.tie_embeddings && o.format != SynthFormat::Exl3;
  EXPECT_EQ(disk->lm_head.same_storage(disk->embed), tied_table);
  EXPECT_EQ(mem->lm_head.same_storage(mem->embed), tied_table);
  std::vector<int32_t> ids = {1, 500, 7, 7, 300, 2, 99, 511, 0, 42, 43, 44, 45, 46, 47, 48, 49, 50, 3};
  auto la = logits_of(mem, ids), lb = logits_of(disk, ids);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << i;
  // The MTP head runs on both (post-norm states stand in for h: any [T, H] rows will do).
  std::vector<float> h(ids.size() * size_t(mem->cfg.hidden));
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(int(i % 7) - 3) * 0.25f;
  auto ma = cpu::mtp_teacher_forced(*mem, ids, h.data(), cpu::AffinePath::Int8);
  auto mb = cpu::mtp_teacher_forced(*disk, ids, h.data(), cpu::AffinePath::Int8);
  ASSERT_EQ(ma.size(), (ids.size() - 1) * size_t(mem->cfg.vocab));
  for (size_t i = 0; i < ma.size(); ++i) ASSERT_EQ(ma[i], mb[i]) << i;
  double ss = 0;
  for (float v : la) { ASSERT_TRUE(std::isfinite(v)); ss += double(v) * v; }
  EXPECT_GT(ss, 0);
}

// tiny is qwen3_5_moe (flat in_proj_qkv/z/b/a); tiny-next is qwen3_next, whose grouped in_proj_qkvz /
// in_proj_ba on disk the loader regroups, and the in-memory builder must regroup the same way; tiny-dense
// is the dense Qwen3.5 (SwiGLU MLP in every layer, tied embeddings).
INSTANTIATE_TEST_SUITE_P(All, SynthFormats,
                         ::testing::Combine(::testing::Values("tiny", "tiny-next", "tiny-dense"),
                                            ::testing::Values(SynthFormat::BF16, SynthFormat::Affine4, SynthFormat::Affine8,
                                                              SynthFormat::Exl3)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + synth_format_name(std::get<1>(info.param));
                           for (auto& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

TEST(Synth, RouterSpreadsOverAllExperts) {
  SynthOptions o;
  o.preset = "small";
  std::vector<std::shared_ptr<void>> owned;
  auto r = router_spread(synth_router(o, 0, owned), 8, 1000, 3);
  EXPECT_EQ(r.experts, 64);
  EXPECT_EQ(r.used, 64);
  EXPECT_GT(r.min_share, 0.6);
  EXPECT_LT(r.max_share, 1.4);
}

TEST(Synth, PresetsHaveTheRealShapes) {
  SynthOptions o;
  o.preset = "qwen3.5-35b-a3b";
  auto c = ModelConfig::from_json(synth_config(o), "test");
  EXPECT_EQ(c.arch, Arch::Qwen35Moe);
  EXPECT_EQ(c.layers, 40);
  EXPECT_EQ(c.n_full_layers(), 10);
  EXPECT_EQ(c.n_experts, 256);
  EXPECT_EQ(c.vocab, 248320);
  EXPECT_EQ(c.rotary_dim, 64);
  o.preset = "qwen3-next-80b-a3b";
  o.format = SynthFormat::Exl3;
  auto n = ModelConfig::from_json(synth_config(o), "test");
  EXPECT_EQ(n.arch, Arch::Qwen3Next);
  EXPECT_EQ(n.layers, 48);
  EXPECT_EQ(n.n_experts, 512);
  EXPECT_EQ(n.top_k, 10);
  // Dense Qwen3.5-0.8B and -4B (sources in the README).
  o.format = SynthFormat::BF16;
  o.preset = "qwen3.5-0.8b";
  auto d = ModelConfig::from_json(synth_config(o), "test");
  EXPECT_EQ(d.arch, Arch::Qwen35);
  EXPECT_EQ(d.hidden, 1024);
  EXPECT_EQ(d.layers, 24);
  EXPECT_EQ(d.n_full_layers(), 6);
  EXPECT_EQ(d.n_moe_layers(), 0);
  EXPECT_EQ(d.dense_inter, 3584);
  EXPECT_EQ(d.n_heads, 8);
  EXPECT_EQ(d.n_kv_heads, 2);
  EXPECT_EQ(d.lin_k_heads, 16);
  EXPECT_EQ(d.lin_v_heads, 16);
  EXPECT_TRUE(d.tie_embeddings);
  o.preset = "qwen3.5-4b";
  auto d4 = ModelConfig::from_json(synth_config(o), "test");
  EXPECT_EQ(d4.hidden, 2560);
  EXPECT_EQ(d4.layers, 32);
  EXPECT_EQ(d4.dense_inter, 9216);
  EXPECT_EQ(d4.n_heads, 16);
  EXPECT_EQ(d4.n_kv_heads, 4);
  EXPECT_EQ(d4.lin_v_heads, 32);
  EXPECT_EQ(d4.vocab, 248320);
  o.preset = "nope";
  EXPECT_THROW(synth_config(o), InputError);
  EXPECT_THROW(parse_synth_format("int4"), InputError);
}

TEST(Bench, RunsAndReportsRooflineFractions) {
  SynthOptions o;
  o.preset = "tiny";
  o.format = SynthFormat::Affine4;
  auto w = synth_model(o);
  BenchOptions b;
  b.prefill = {17, 64};
  b.decode_context = {33};
  b.repeats = 2;
  b.decode_tokens = 3;
  b.prefill_chunk = 32;
  b.progress = false;
  b.label = "tiny";
  auto rep = run_bench(w, b);
  ASSERT_EQ(rep.prefill.size(), 2u);
  ASSERT_EQ(rep.decode.size(), 1u);
  EXPECT_GT(rep.bandwidth, 1e8);
  for (auto* rows : {&rep.prefill, &rep.decode})
    for (auto& r : *rows) {
      EXPECT_EQ(r.runs.size(), 2u);
      EXPECT_GT(r.tok_s, 0);
      EXPECT_GT(r.bytes_per_token, 0);
      EXPECT_GT(r.roofline_tok_s, 0);
    }
  // Decode reads at least the active weights per token.
  EXPECT_GE(rep.decode[0].bytes_per_token, double(w->active_bytes_per_token()));
  auto j = rep.to_json();
  EXPECT_EQ(j["decode"][0]["context"], 33);
  EXPECT_NE(rep.table().find("decode@"), std::string::npos);
  EXPECT_GT(rep.resident, w->weight_bytes());  // the in-memory weights are resident
  EXPECT_EQ(parse_sizes("256,1k,4K", "x"), (std::vector<int64_t>{256, 1024, 4096}));
  EXPECT_THROW(parse_sizes("12,x", "--prefill"), InputError);
}

TEST(Bench, StreamsAndVerificationSteps) {
  SynthOptions o;
  o.preset = "tiny";
  o.format = SynthFormat::Affine4;
  auto w = synth_model(o);
  BenchOptions b;
  b.prefill = {8};
  b.decode_context = {16};
  b.repeats = 1;
  b.decode_tokens = 4;
  b.progress = false;
  b.streams = {1, 3};
  b.stream_context = 40;
  b.verify = {2, 4};
  auto rep = run_bench(w, b);
  ASSERT_EQ(rep.streams.size(), 2u);
  for (auto& r : rep.streams) {
    EXPECT_GT(r.aggregate_tok_s, 0);
    EXPECT_GT(r.per_stream_tok_s, 0);
    EXPECT_LE(r.per_stream_tok_s, r.aggregate_tok_s * 1.0001);
  }
  ASSERT_EQ(rep.verify.size(), 2u);
  EXPECT_EQ(rep.verify[1].rows, 4);
  EXPECT_GT(rep.verify[1].ratio(), 0);
  auto j = rep.to_json();
  EXPECT_EQ(j["streams"][1]["streams"], 3);
  EXPECT_TRUE(j["streams"][1]["aggregate_tok_s"].is_number());
  EXPECT_TRUE(j["verify"][0]["ratio"].is_number());
  b.verify = {kMaxTentativeRows + 1};
  EXPECT_THROW(run_bench(w, b), InputError);
}

}  // namespace
}  // namespace lily
