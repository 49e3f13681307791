// config.json forms and their errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/config.h"

using namespace lily;
using nlohmann::json;

namespace {

json base_next() {
  return json::parse(R"({
    "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 100,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "intermediate_size": 96, "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true, "eos_token_id": 7
  })");
}

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j, "config.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, Qwen3NextDefaults) {
  auto c = ModelConfig::from_json(base_next(), "config.json");
  EXPECT_EQ(c.arch, Arch::Qwen3Next);
  EXPECT_EQ(c.tensor_prefix, "model.");
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  // No layer_types: full attention every 4th layer (3, 7).
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(c.layer_kinds[size_t(i)] == LayerKind::FullAttention, i == 3 || i == 7) << i;
  for (bool m : c.layer_is_moe) EXPECT_TRUE(m);
  EXPECT_EQ(c.eos_ids, std::vector<int64_t>{7});
  EXPECT_EQ(c.rope_freq_dtype, DType::F32);
}

TEST(Config, DenseLayersAndSparseStep) {
  auto j = base_next();
  j["mlp_only_layers"] = {0, 5};
  j["decoder_sparse_step"] = 2;
  auto c = ModelConfig::from_json(j, "config.json");
  // MoE iff i not in mlp_only_layers and (i+1) % 2 == 0.
  std::vector<bool> want = {false, true, false, true, false, false, false, true};
  EXPECT_EQ(c.layer_is_moe, want);
}

TEST(Config, NestedQwen35WithRopeParameters) {
  auto text = base_next();
  text["model_type"] = "qwen3_5_moe_text";
  text.erase("rope_theta");
  text.erase("partial_rotary_factor");
  text["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.5},
                             {"mrope_section", {2, 2, 4}}, {"mrope_interleaved", true}};
  text["layer_types"] = {"linear_attention", "full_attention", "linear_attention", "linear_attention",
                         "linear_attention", "linear_attention", "linear_attention", "full_attention"};
  text["dtype"] = "bfloat16";
  json top = {{"model_type", "qwen3_5_moe"}, {"text_config", text}, {"vision_config", json::object()}};
  auto c = ModelConfig::from_json(top, "config.json");
  EXPECT_EQ(c.arch, Arch::Qwen35Moe);
  EXPECT_EQ(c.tensor_prefix, "model.language_model.");
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.layer_kinds[1], LayerKind::FullAttention);
  EXPECT_EQ(c.n_full_layers(), 2);
  EXPECT_EQ(c.rope_freq_dtype, DType::BF16);
}

// The dense Qwen3.5 as the 0.8B-27B releases write it: model_type qwen3_5 with the text model
// (qwen3_5_text) under text_config and tie_word_embeddings at the top level, or a flat qwen3_5_text save.
json dense_text() {
  return json::parse(R"({
    "model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 100,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "hidden_act": "silu", "attention_bias": false, "attn_output_gate": true, "attention_dropout": 0.0,
    "initializer_range": 0.02, "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144,
    "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": false, "rms_norm_eps": 1e-06,
    "use_cache": true, "dtype": "bfloat16", "eos_token_id": 99, "bos_token_id": null, "pad_token_id": null,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [1, 1, 0], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25}
  })");
}

TEST(Config, DenseQwen35) {
  auto flat = ModelConfig::from_json(dense_text(), "config.json");
  EXPECT_EQ(flat.arch, Arch::Qwen35);
  EXPECT_STREQ(arch_name(flat.arch), "qwen3_5");
  EXPECT_EQ(flat.tensor_prefix, "model.");
  EXPECT_EQ(flat.dense_inter, 96);
  EXPECT_EQ(flat.n_moe_layers(), 0);
  EXPECT_EQ(flat.n_full_layers(), 2);
  EXPECT_FALSE(flat.tie_embeddings);
  EXPECT_EQ(flat.to_json()["moe"], nullptr);
  EXPECT_EQ(flat.to_json()["dense_mlp"]["intermediate"], 96);

  json top = {{"model_type", "qwen3_5"}, {"architectures", {"Qwen3_5ForConditionalGeneration"}},
              {"text_config", dense_text()}, {"vision_config", {{"depth", 12}, {"out_hidden_size", 64}}},
              {"image_token_id", 248056}, {"tie_word_embeddings", true}};
  auto c = ModelConfig::from_json(top, "config.json");
  EXPECT_EQ(c.arch, Arch::Qwen35);
  EXPECT_EQ(c.tensor_prefix, "model.language_model.");
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_EQ(c.rope_freq_dtype, DType::BF16);
  EXPECT_EQ(c.eos_ids, std::vector<int64_t>{99});

  // MoE fields in a dense config are not read (HF's dense class has none): every layer stays dense.
  auto j = dense_text();
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  auto d = ModelConfig::from_json(j, "config.json");
  EXPECT_EQ(d.n_moe_layers(), 0);
  EXPECT_EQ(d.n_experts, 0);

  j = dense_text();
  j.erase("intermediate_size");
  EXPECT_NE(error_of(j).find("missing field 'intermediate_size'"), std::string::npos) << error_of(j);
  j = dense_text();
  j["attention_bias"] = true;
  EXPECT_NE(error_of(j).find("attention_bias true is not supported"), std::string::npos) << error_of(j);
  j = dense_text();
  j["attn_output_gate"] = false;
  EXPECT_NE(error_of(j).find("attn_output_gate false is not supported"), std::string::npos) << error_of(j);
  EXPECT_NE(error_of(json{{"model_type", "qwen3_5"}}).find("model_type qwen3_5 needs an object 'text_config'"),
            std::string::npos);
}

TEST(Config, Errors) {
  auto j = base_next();
  j["layer_types"] = {"linear_attention"};
  EXPECT_NE(error_of(j).find("'layer_types' has 1 entries but num_hidden_layers is 8"), std::string::npos);
  j = base_next();
  j["layer_types"] = json::array();
  for (int i = 0; i < 8; ++i) j["layer_types"].push_back("sliding_attention");
  EXPECT_NE(error_of(j).find("'sliding_attention'"), std::string::npos) << error_of(j);
  j = base_next();
  j["linear_num_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("not a multiple of linear_num_key_heads"), std::string::npos);
  j = base_next();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}};
  EXPECT_NE(error_of(j).find("rope_type 'yarn' is not supported"), std::string::npos) << error_of(j);
  j = base_next();
  j["hidden_size"] = "64";
  EXPECT_NE(error_of(j).find("field 'hidden_size' must be an integer"), std::string::npos);
  j = base_next();
  j["num_experts_per_tok"] = 9;
  EXPECT_NE(error_of(j).find("num_experts_per_tok 9"), std::string::npos);
  j = base_next();
  j["partial_rotary_factor"] = 0.3;
  EXPECT_NE(error_of(j).find("even rotary dimension"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("not a JSON object"), std::string::npos);
  // found by fuzz_config: head_dim × a huge factor converted to an integer out of range
  j = base_next();
  j["partial_rotary_factor"] = 1.42222e117;
  EXPECT_NE(error_of(j).find("partial_rotary_factor 1.42222e+117 must be in (0, 1]"), std::string::npos) << error_of(j);
  j["partial_rotary_factor"] = -0.5;
  EXPECT_NE(error_of(j).find("partial_rotary_factor -0.5 must be in (0, 1]"), std::string::npos) << error_of(j);
  j = base_next();
  j["head_dim"] = int64_t(1) << 62;
  EXPECT_NE(error_of(j).find("field 'head_dim' is 4611686018427387904, larger than 2^31"), std::string::npos) << error_of(j);
  j = base_next();
  j["rms_norm_eps"] = -1e-6;
  EXPECT_NE(error_of(j).find("rms_norm_eps -1e-06 must be in (0, 1)"), std::string::npos) << error_of(j);
  j = base_next();
  j["rope_theta"] = 0;
  EXPECT_NE(error_of(j).find("rope_theta must be a positive finite number"), std::string::npos) << error_of(j);
  j = base_next();  // found by fuzz_config: a non-string quant_method threw nlohmann's type_error
  j["quantization"] = {{"quant_method", {{"bits", 4}}}, {"group_size", 64}, {"bits", 4}};
  EXPECT_NE(error_of(j).find("'quant_method' of the quantization object must be a string"), std::string::npos) << error_of(j);
  j["quantization"] = {{"quant_method", "exl3"}, {"bits", 4}};
  EXPECT_EQ(ModelConfig::from_json(j, "config.json").quant_method, "exl3");
  json nested = {{"model_type", "qwen3_5_moe"}};
  EXPECT_NE(error_of(nested).find("needs an object 'text_config'"), std::string::npos);
}

TEST(SafeTensors, WriteReadRoundTrip) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {0x3f80, 0x4000};
  auto path = std::filesystem::temp_directory_path() / ("lily_st_" + std::to_string(::getpid()) + ".safetensors");
  write_safetensors(path.string(), {{"a", DType::F32, {2, 3}, a.data(), a.size() * 4},
                                    {"b", DType::BF16, {2}, b.data(), b.size() * 2},
                                    {"empty", DType::F32, {0}, nullptr, 0}},
                    {{"format", "pt"}});
  SafeTensorsFile f(path.string());
  ASSERT_EQ(f.tensors().size(), 3u);
  const auto& ta = f.tensors().at("a");
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(ta.data, a.data(), 24), 0);
  EXPECT_EQ(f.tensors().at("b").dtype, DType::BF16);
  EXPECT_EQ(f.metadata()["format"], "pt");
  // The data section starts 8-byte aligned.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta.data) % 8, 0u);
  std::filesystem::remove(path);
}

}  // namespace
