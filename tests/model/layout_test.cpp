// Checkpoint layouts: the same golden weights re-saved as HF's fused experts under the nested
// qwen3_5_moe layout (model.language_model.*, text_config, visual tensors to ignore), the dense
// golden under the nested qwen3_5 layout, mlx-lm's sanitised names, and config variants (top-level RoPE
// keys, full_attention_interval), must give identical logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/session.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lily;
using nlohmann::json;

namespace {

std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& ids) {
  EngineOptions eo;
  eo.ctx_size = int64_t(ids.size());
  auto e = Engine::open(dir, eo);
  Session s(*e);
  std::vector<float> out(ids.size() * size_t(e->config().vocab));
  s.prefill(ids, nullptr, out.data());
  return out;
}

std::vector<int32_t> prompt_of(const std::string& dir) {
  auto j = json::parse(read_text_file(dir + "/golden.json"));
  auto ids = j["prompt_ids"].get<std::vector<int32_t>>();
  ids.resize(70);
  return ids;
}

fs::path scratch(const std::string& name) {
  auto p = fs::temp_directory_path() / ("lily_layout_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

TEST(Layout, FusedExpertsNestedQwen35Moe) {
  const std::string src = test::golden_dir("qwen3_5_moe_text-a");
  ASSERT_FALSE(src.empty());
  Checkpoint ck(src);
  auto cfg = json::parse(read_text_file(src + "/config.json"));
  const int64_t E = cfg["num_experts"], I = cfg["moe_intermediate_size"], H = cfg["hidden_size"];
  const int64_t L = cfg["num_hidden_layers"];

  std::vector<std::vector<uint8_t>> bufs;
  std::vector<TensorToWrite> out;
  for (auto& [name, t] : ck.tensors()) {
    if (name.find(".mlp.experts.") != std::string::npos) continue;
    std::string n = name;
    if (n.rfind("model.", 0) == 0) n = "model.language_model." + n.substr(6);
    out.push_back({n, t->dtype, t->shape, t->data, t->nbytes});
  }
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    std::vector<uint8_t> gu(size_t(E * 2 * I * H) * 2), dn(size_t(E * H * I) * 2);
    for (int64_t e = 0; e < E; ++e) {
      const auto& g = ck.get(p + std::to_string(e) + ".gate_proj.weight");
      const auto& u = ck.get(p + std::to_string(e) + ".up_proj.weight");
      const auto& d = ck.get(p + std::to_string(e) + ".down_proj.weight");
      std::memcpy(gu.data() + size_t(e * 2 * I * H) * 2, g.data, g.nbytes);
      std::memcpy(gu.data() + size_t(e * 2 * I * H + I * H) * 2, u.data, u.nbytes);
      std::memcpy(dn.data() + size_t(e * H * I) * 2, d.data, d.nbytes);
    }
    bufs.push_back(std::move(gu));
    bufs.push_back(std::move(dn));
    const std::string q = "model.language_model.layers." + std::to_string(l) + ".mlp.experts.";
    out.push_back({q + "gate_up_proj", DType::BF16, {E, 2 * I, H}, bufs[bufs.size() - 2].data(), bufs[bufs.size() - 2].size()});
    out.push_back({q + "down_proj", DType::BF16, {E, H, I}, bufs.back().data(), bufs.back().size()});
  }
  // Tensors a text model must ignore (mtp.* is the MTP block, loaded: tests/model/mtp_golden_test.cpp).
  std::vector<uint8_t> junk(64 * 2, 0x3f);
  out.push_back({"model.visual.patch_embed.proj.weight", DType::BF16, {8, 8}, junk.data(), junk.size()});

  auto dir = scratch("nested");
  // Two shards + index.
  std::vector<TensorToWrite> a(out.begin(), out.begin() + long(out.size() / 2)), b(out.begin() + long(out.size() / 2), out.end());
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), a);
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(), b);
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(1);

  json text = cfg;
  // Older saves keep RoPE at the top level instead of rope_parameters.
  text.erase("rope_parameters");
  text["rope_theta"] = cfg["rope_parameters"]["rope_theta"];
  text["partial_rotary_factor"] = cfg["rope_parameters"]["partial_rotary_factor"];
  json top = {{"model_type", "qwen3_5_moe"}, {"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
              {"text_config", text}, {"vision_config", {{"depth", 2}}}, {"tie_word_embeddings", false}};
  std::ofstream(dir / "config.json") << top.dump(1);

  auto ids = prompt_of(src);
  EXPECT_LE(max_diff(logits_of(src, ids), logits_of(dir.string(), ids)), 1e-6);
  fs::remove_all(dir);
}

// The dense Qwen3.5 as Qwen3_5ForConditionalGeneration saves it: model_type qwen3_5 with the text model
// under text_config, tensors under model.language_model.*, the MTP block under mtp.* and a vision tower
// under model.visual.* (ignored).
TEST(Layout, NestedQwen35Dense) {
  const std::string src = test::golden_dir("qwen3_5_text-a-mtp");
  ASSERT_FALSE(src.empty());
  Checkpoint ck(src);
  std::vector<TensorToWrite> out;
  for (auto& [name, t] : ck.tensors()) {
    std::string n = name;
    if (n.rfind("model.", 0) == 0) n = "model.language_model." + n.substr(6);
    out.push_back({n, t->dtype, t->shape, t->data, t->nbytes});
  }
  ASSERT_TRUE(ck.find("mtp.fc.weight"));  // kept, as the hub checkpoints carry it
  std::vector<uint8_t> junk(64 * 2, 0x3f);
  out.push_back({"model.visual.blocks.0.attn.qkv.weight", DType::BF16, {8, 8}, junk.data(), junk.size()});
  auto dir = scratch("nested_dense");
  write_safetensors((dir / "model.safetensors").string(), out);
  json text = json::parse(read_text_file(src + "/config.json"));
  text.erase("architectures");
  text["model_type"] = "qwen3_5_text";
  json top = {{"model_type", "qwen3_5"}, {"architectures", {"Qwen3_5ForConditionalGeneration"}},
              {"text_config", text}, {"vision_config", {{"depth", 2}, {"model_type", "qwen3_5"}}},
              {"image_token_id", 248056}, {"video_token_id", 248057}, {"vision_start_token_id", 248053},
              {"vision_end_token_id", 248054}, {"tie_word_embeddings", false}};
  std::ofstream(dir / "config.json") << top.dump(1);
  auto cfg = ModelConfig::load(dir.string());
  EXPECT_EQ(cfg.arch, Arch::Qwen35);
  EXPECT_EQ(cfg.tensor_prefix, "model.language_model.");
  EXPECT_EQ(cfg.n_moe_layers(), 0);
  auto w = ModelWeights::load(dir.string());
  ASSERT_TRUE(w->mtp);  // the MTP block, with its dense MLP
  EXPECT_FALSE(w->mtp->layer.ffn.moe);
  auto ids = prompt_of(src);
  EXPECT_LE(max_diff(logits_of(src, ids), logits_of(dir.string(), ids)), 1e-6);
  fs::remove_all(dir);
}

// mlx-lm's conversion (mlx_lm/models/qwen3_5.py sanitize): tensors under language_model.model.* and
// language_model.lm_head, mtp.* dropped, conv taps last ([C, K, 1]) and zero-centred norms stored as
// 1 + w (here in F32 so the shift is exact). Both Qwen3.5 kinds, MoE and dense.
class MlxSanitized : public ::testing::TestWithParam<std::string> {};

TEST_P(MlxSanitized, SameLogits) {
  const std::string src = test::golden_dir(GetParam());
  ASSERT_FALSE(src.empty());
  Checkpoint ck(src);
  std::vector<std::vector<float>> bufs;
  std::vector<TensorToWrite> out;
  auto ends_with = [](const std::string& a, const std::string& b) {
    return a.size() >= b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
  };
  for (auto& [name, t] : ck.tensors()) {
    if (name.rfind("mtp.", 0) == 0) continue;
    std::string n = name == "lm_head.weight" ? "language_model.lm_head.weight" : "language_model." + name;
    TensorToWrite w{n, t->dtype, t->shape, t->data, t->nbytes};
    if (ends_with(name, "conv1d.weight")) w.shape = {t->shape[0], t->shape[2], 1};
    const bool shifted = ends_with(name, "input_layernorm.weight") || ends_with(name, "post_attention_layernorm.weight") ||
                         ends_with(name, "q_norm.weight") || ends_with(name, "k_norm.weight") || name == "model.norm.weight";
    if (shifted) {
      std::vector<float> v(static_cast<size_t>(t->numel()));
      for (size_t i = 0; i < v.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, t->data + 2 * i, 2);
        uint32_t u = uint32_t(h) << 16;
        std::memcpy(&v[i], &u, 4);
        v[i] += 1.0f;
      }
      bufs.push_back(std::move(v));
      w = {n, DType::F32, t->shape, bufs.back().data(), bufs.back().size() * 4};
    }
    out.push_back(w);
  }
  auto dir = scratch("mlx_" + GetParam());
  write_safetensors((dir / "model.safetensors").string(), out);
  fs::copy_file(src + "/config.json", dir / "config.json");
  auto ids = prompt_of(src);
  EXPECT_LE(max_diff(logits_of(src, ids), logits_of(dir.string(), ids)), 1e-5);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Qwen35, MlxSanitized, ::testing::Values("qwen3_5_moe_text-a", "qwen3_5_text-a-mtp"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

TEST(Layout, Qwen3NextIntervalConfig) {
  const std::string src = test::golden_dir("qwen3_next-a");
  ASSERT_FALSE(src.empty());
  auto dir = scratch("interval");
  fs::copy_file(src + "/model.safetensors", dir / "model.safetensors");
  auto cfg = json::parse(read_text_file(src + "/config.json"));
  cfg.erase("layer_types");
  cfg["full_attention_interval"] = 4;  // layers 3, 7, ... are full attention
  std::ofstream(dir / "config.json") << cfg.dump(1);
  auto ids = prompt_of(src);
  EXPECT_LE(max_diff(logits_of(src, ids), logits_of(dir.string(), ids)), 1e-6);
  fs::remove_all(dir);
}

TEST(Layout, TiedEmbeddings) {
  const std::string src = test::golden_dir("qwen3_5_moe_text-a");
  ASSERT_FALSE(src.empty());
  Checkpoint ck(src);
  auto dir = scratch("tied");
  std::vector<TensorToWrite> out;
  for (auto& [name, t] : ck.tensors())
    if (name != "lm_head.weight") out.push_back({name, t->dtype, t->shape, t->data, t->nbytes});
  write_safetensors((dir / "model.safetensors").string(), out);
  auto cfg = json::parse(read_text_file(src + "/config.json"));
  cfg["tie_word_embeddings"] = true;
  std::ofstream(dir / "config.json") << cfg.dump(1);
  // Tied: logits = norm(x) · embed_tokensᵀ. Compare against a checkpoint whose lm_head is a copy.
  auto dir2 = scratch("tied_copy");
  auto out2 = out;
  const auto& emb = ck.get("model.embed_tokens.weight");
  out2.push_back({"lm_head.weight", emb.dtype, emb.shape, emb.data, emb.nbytes});
  write_safetensors((dir2 / "model.safetensors").string(), out2);
  cfg["tie_word_embeddings"] = false;
  std::ofstream(dir2 / "config.json") << cfg.dump(1);
  auto ids = prompt_of(src);
  EXPECT_LE(max_diff(logits_of(dir.string(), ids), logits_of(dir2.string(), ids)), 1e-6);
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

}  // namespace
