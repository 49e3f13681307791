// The synth presets and the config.json each one writes (tools/synth.h). Shapes of the real models and
// where each number comes from are listed in the README ("Benchmarks and peers").
#include <algorithm>


#include "core/error.h"
#include "tools/synth.h"

namespace lily {

namespace {

struct Preset {
  const char* name;
  const char* model_type;
  int64_t hidden, layers, vocab, heads, kv_heads, head_dim, k_heads, v_heads, kd, vd, experts, top_k, inter, shared,
      dense_inter;
  double theta;
  bool tied;  // lm_head = embed_tokens (the dense releases)
};

const Preset kPresets[] = {
    {"qwen3.5-35b-a3b", "qwen3_5_moe_text", 2048, 40, 248320, 16, 2, 256, 16, 32, 128, 128, 256, 8, 512, 512, 0, 1e7, false},
    {"qwen3-next-80b-a3b", "qwen3_next", 2048, 48, 151936, 16, 2, 256, 16, 32, 128, 128, 512, 10, 512, 512, 5120, 1e7, false},
    {"qwen3.5-397b-a17b", "qwen3_5_moe_text", 4096, 60, 248320, 32, 2, 256, 16, 64, 128, 128, 512, 10, 1024, 1024, 0, 1e7, false},
    // Dense Qwen3.5: a SwiGLU MLP of dense_inter in every layer, tied embeddings.
    {"qwen3.5-0.8b", "qwen3_5_text", 1024, 24, 248320, 8, 2, 256, 16, 16, 128, 128, 0, 0, 0, 0, 3584, 1e7, true},
    {"qwen3.5-4b", "qwen3_5_text", 2560, 32, 248320, 16, 4, 256, 16, 32, 128, 128, 0, 0, 0, 0, 9216, 1e7, true},
    {"small", "qwen3_5_moe_text", 1024, 16, 151936, 8, 2, 256, 8, 16, 128, 128, 64, 8, 512, 512, 0, 1e7, false},
    {"tiny", "qwen3_5_moe_text", 128, 4, 512, 4, 2, 64, 2, 4, 32, 32, 8, 2, 64, 128, 0, 1e6, false},
    {"tiny-next", "qwen3_next", 128, 4, 512, 4, 2, 64, 2, 4, 32, 32, 8, 2, 64, 128, 256, 1e6, false},
    {"tiny-dense", "qwen3_5_text", 128, 4, 512, 4, 2, 64, 2, 4, 32, 32, 0, 0, 0, 0, 256, 1e6, true},
    // the shared expert as wide as the routed ones (it rides in the expert stacks on CUDA)
    {"tiny-stacked", "qwen3_5_moe_text", 256, 4, 1024, 4, 2, 128, 2, 4, 64, 64, 16, 4, 128, 128, 0, 1e6, false},
    // Head counts, experts and widths that divide by 8 (model/shard.h at 8 ranks; affine groups of 64 per rank).
    {"tiny-tp8", "qwen3_5_moe_text", 128, 4, 512, 8, 2, 64, 4, 8, 64, 64, 16, 4, 64, 512, 0, 1e6, false},
};

const Preset& preset(const std::string& name) {
  for (auto& p : kPresets)
    if (name == p.name) return p;
  std::string all;
  for (auto& p : kPresets) all += std::string(all.empty() ? "" : ", ") + p.name;
  fail("--preset: '{}' is not one of {}", name, all);
}

}  // namespace

const std::vector<std::string>& synth_presets() {
  static std::vector<std::string> v = [] {
    std::vector<std::string> r;
    for (auto& p : kPresets) r.push_back(p.name);
    return r;
  }();
  return v;
}

std::string synth_preset_list() {
  std::string s;
  for (const auto& p : synth_presets()) s += (s.empty() ? "" : " | ") + p;
  return s;
}

SynthFormat parse_synth_format(const std::string& s) {
  if (s == "bf16") return SynthFormat::BF16;
  if (s == "affine4") return SynthFormat::Affine4;
  if (s == "affine8") return SynthFormat::Affine8;
  if (s == "exl3") return SynthFormat::Exl3;
  fail("--format: '{}' is not one of bf16, affine4, affine8, exl3", s);
}

quant::Exl3Codebook parse_codebook(const std::string& s) {
  if (s == "mcg") return quant::Exl3Codebook::Mcg;
  if (s == "mul1") return quant::Exl3Codebook::Mul1;
  if (s == "3inst") return quant::Exl3Codebook::Inst3;
  fail("--codebook: '{}' is not one of mcg, mul1, 3inst", s);
}

const char* synth_format_name(SynthFormat f) {
  switch (f) {
    case SynthFormat::BF16: return "bf16";
    case SynthFormat::Affine4: return "affine4";
    case SynthFormat::Affine8: return "affine8";
    case SynthFormat::Exl3: return "exl3";
  }
  return "?";
}

nlohmann::json synth_config(const SynthOptions& opt) {
  const Preset& p = preset(opt.preset);
  if (opt.format == SynthFormat::Exl3 && (opt.exl3_bits < 1 || opt.exl3_bits > 8))
    fail("--bits: {} is outside 1..8", opt.exl3_bits);
  if (opt.layers < 0) fail("synth: {} layers", opt.layers);
  const int64_t n_layers = opt.layers > 0 ? opt.layers : p.layers;
  const std::string mt = p.model_type;
  const bool next = mt == "qwen3_next", dense = mt == "qwen3_5_text";
  nlohmann::json layer_types = nlohmann::json::array();
  for (int64_t i = 0; i < n_layers; ++i) layer_types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", p.theta}, {"partial_rotary_factor", 0.25}};
  if (!next) {
    int64_t half = p.head_dim / 4 / 2;  // rotary/2 frequencies split 3:3:2 like [11, 11, 10] of 32
    int64_t a = (half * 11 + 16) / 32, b = a;
    rope["mrope_section"] = {a, b, half - a - b};
    rope["mrope_interleaved"] = true;
  }
  const char* arch = next ? "Qwen3NextForCausalLM" : dense ? "Qwen3_5ForCausalLM" : "Qwen3_5MoeForCausalLM";
  nlohmann::json j = {
      {"architectures", {arch}},
      {"model_type", p.model_type},
      {"hidden_size", p.hidden},
      {"num_hidden_layers", n_layers},
      {"vocab_size", p.vocab},
      {"num_attention_heads", p.heads},
      {"num_key_value_heads", p.kv_heads},
      {"head_dim", p.head_dim},
      {"partial_rotary_factor", 0.25},
      {"rope_parameters", rope},
      {"linear_num_key_heads", p.k_heads},
      {"linear_num_value_heads", p.v_heads},
      {"linear_key_head_dim", p.kd},
      {"linear_value_head_dim", p.vd},
      {"linear_conv_kernel_dim", 4},
      {"layer_types", layer_types},
      {"full_attention_interval", 4},
      {"rms_norm_eps", 1e-6},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"tie_word_embeddings", p.tied},
      {"max_position_embeddings", 262144},
      {"eos_token_id", p.vocab - 1},
      {"bos_token_id", nullptr},
      {"torch_dtype", "bfloat16"},
      {"lily_synth", {{"preset", p.name}, {"format", synth_format_name(opt.format)}, {"seed", opt.seed}}},
  };
  // Qwen3.5 configs declare the MTP block; Qwen3-Next's name none (its mtp.* tensors decide).
  if (!next) j["mtp_num_hidden_layers"] = 1;
  if (dense) {
    j["intermediate_size"] = p.dense_inter;
    j["attn_output_gate"] = true;
    j["mamba_ssm_dtype"] = "float32";
  } else {
    j["num_experts"] = p.experts;
    j["num_experts_per_tok"] = p.top_k;
    j["moe_intermediate_size"] = p.inter;
    j["shared_expert_intermediate_size"] = p.shared;
    j["norm_topk_prob"] = true;
  }
  if (next) {
    j["intermediate_size"] = p.dense_inter;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
  }
  if (opt.format == SynthFormat::Affine4 || opt.format == SynthFormat::Affine8) {
    nlohmann::json q = {{"group_size", 64}, {"bits", opt.format == SynthFormat::Affine4 ? 4 : 8}, {"mode", "affine"}};
    j["quantization"] = q;
    j["quantization_config"] = q;
  } else if (opt.format == SynthFormat::Exl3) {
    const char* cb = opt.codebook == quant::Exl3Codebook::Mcg ? "mcg" : opt.codebook == quant::Exl3Codebook::Mul1 ? "mul1" : "3inst";
    j["quantization_config"] = {{"quant_method", "exl3"}, {"bits", opt.exl3_bits}, {"head_bits", std::max(6, opt.exl3_bits)},
                                {"codebook", cb}, {"version", "lily-synth"}};
  }
  return j;
}

}  // namespace lily
