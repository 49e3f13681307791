#include "model/config.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/mapped_file.h"

namespace lily {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Qwen3Next: return "qwen3_next";
    case Arch::Qwen35Moe: return "qwen3_5_moe";
    case Arch::Qwen35: return "qwen3_5";
  }
  return "?";
}

int64_t ModelConfig::n_full_layers() const {
  int64_t n = 0;
  for (auto k : layer_kinds) n += k == LayerKind::FullAttention;
  return n;
}

int64_t ModelConfig::n_moe_layers() const {
  int64_t n = 0;
  for (bool m : layer_is_moe) n += m;
  return n;
}

namespace {

struct Reader {
  const nlohmann::json& j;
  std::string where;

  const nlohmann::json* find(const char* key) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
  }
  int64_t int_req(const char* key) const {
    auto* v = find(key);
    if (!v) fail("{}: missing field '{}'", where, key);
    if (!v->is_number_integer()) fail("{}: field '{}' must be an integer", where, key);
    return v->get<int64_t>();
  }
  int64_t int_opt(const char* key, int64_t def) const {
    auto* v = find(key);
    if (!v) return def;
    if (!v->is_number_integer()) fail("{}: field '{}' must be an integer", where, key);
    return v->get<int64_t>();
  }
  double num_opt(const char* key, double def) const {
    auto* v = find(key);
    if (!v) return def;
    if (!v->is_number()) fail("{}: field '{}' must be a number", where, key);
    return v->get<double>();
  }
  bool bool_opt(const char* key, bool def) const {
    auto* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) fail("{}: field '{}' must be true or false", where, key);
    return v->get<bool>();
  }
};

void positive(const std::string& where, const char* key, int64_t v) {
  if (v <= 0) fail("{}: field '{}' must be positive (got {})", where, key, v);
  // Products of dimensions are int64 and doubles; no real model comes near 2^31.
  if (v > (int64_t(1) << 31)) fail("{}: field '{}' is {}, larger than 2^31", where, key, v);
}

std::vector<int64_t> ids_of(const nlohmann::json* v) {
  std::vector<int64_t> out;
  if (!v || v->is_null()) return out;
  if (v->is_number_integer()) out.push_back(v->get<int64_t>());
  if (v->is_array())
    for (auto& x : *v)
      if (x.is_number_integer()) out.push_back(x.get<int64_t>());
  return out;
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& top, const std::string& where) {
  if (!top.is_object()) fail("{}: not a JSON object", where);
  ModelConfig c;
  auto mt = top.find("model_type");
  if (mt == top.end() || !mt->is_string()) fail("{}: missing field 'model_type'", where);
  c.model_type = mt->get<std::string>();
  const nlohmann::json* tj = &top;
  std::string twhere = where;
  // model_type -> architecture, and whether the text model sits under text_config (multimodal saves,
  // tensors under model.language_model.) or at the top level (text-only saves, tensors under model.).
  struct Kind {
    const char* model_type;
    Arch arch;
    bool nested;
  };
  static constexpr Kind kinds[] = {{"qwen3_next", Arch::Qwen3Next, false},  {"qwen3_5_moe_text", Arch::Qwen35Moe, false},
                                   {"qwen3_5_moe", Arch::Qwen35Moe, true},  {"qwen3_5_text", Arch::Qwen35, false},
                                   {"qwen3_5", Arch::Qwen35, true}};
  const Kind* kind = nullptr;
  for (const auto& k : kinds)
    if (c.model_type == k.model_type) kind = &k;
  if (!kind)
    fail("{}: unknown model_type '{}' (supported: qwen3_next, qwen3_5_moe, qwen3_5_moe_text, qwen3_5, qwen3_5_text)",
         where, c.model_type);
  c.arch = kind->arch;
  c.tensor_prefix = kind->nested ? "model.language_model." : "model.";
  if (kind->nested) {
    auto it = top.find("text_config");
    if (it == top.end() || !it->is_object())
      fail("{}: model_type {} needs an object 'text_config'", where, c.model_type);
    tj = &*it;
    twhere = where + " (text_config)";
  }
  Reader r{*tj, twhere};
  c.hidden = r.int_req("hidden_size");
  c.layers = r.int_req("num_hidden_layers");
  c.vocab = r.int_req("vocab_size");
  c.rms_eps = r.num_opt("rms_norm_eps", 1e-6);
  c.n_heads = r.int_req("num_attention_heads");
  c.n_kv_heads = r.int_opt("num_key_value_heads", c.n_heads);
  c.head_dim = r.int_opt("head_dim", c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.lin_k_heads = r.int_req("linear_num_key_heads");
  c.lin_v_heads = r.int_req("linear_num_value_heads");
  c.lin_k_dim = r.int_req("linear_key_head_dim");
  c.lin_v_dim = r.int_req("linear_value_head_dim");
  c.conv_kernel = r.int_opt("linear_conv_kernel_dim", 4);
  c.n_experts = r.int_opt("num_experts", 0);
  c.top_k = r.int_opt("num_experts_per_tok", 0);
  c.moe_inter = r.int_opt("moe_intermediate_size", 0);
  c.shared_inter = r.int_opt("shared_expert_intermediate_size", 0);
  c.dense_inter = c.arch == Arch::Qwen35 ? r.int_req("intermediate_size") : r.int_opt("intermediate_size", 0);
  c.norm_topk = c.arch == Arch::Qwen35Moe ? true : r.bool_opt("norm_topk_prob", true);
  if (c.arch == Arch::Qwen35) c.n_experts = c.top_k = c.moe_inter = c.shared_inter = 0;  // HF's dense class has none
  c.max_positions = r.int_opt("max_position_embeddings", 0);
  // Tied embeddings may be declared at either level.
  c.tie_embeddings = Reader{top, where}.bool_opt("tie_word_embeddings", r.bool_opt("tie_word_embeddings", false));

  // Switches the released models set one way; the forward implements only that way.
  if (auto* act = r.find("hidden_act"); act && (!act->is_string() || act->get<std::string>() != "silu"))
    fail("{}: hidden_act {} is not supported (only \"silu\")", twhere, act->dump());
  if (r.bool_opt("attention_bias", false)) fail("{}: attention_bias true is not supported (no attention biases)", twhere);
  if (!r.bool_opt("attn_output_gate", true))
    fail("{}: attn_output_gate false is not supported (the attention output is always gated)", twhere);

  for (auto [k, v] : {std::pair{"hidden_size", c.hidden}, {"num_hidden_layers", c.layers}, {"vocab_size", c.vocab},
                      {"num_attention_heads", c.n_heads}, {"num_key_value_heads", c.n_kv_heads},
                      {"head_dim", c.head_dim}, {"linear_num_key_heads", c.lin_k_heads},
                      {"linear_num_value_heads", c.lin_v_heads}, {"linear_key_head_dim", c.lin_k_dim},
                      {"linear_value_head_dim", c.lin_v_dim}, {"linear_conv_kernel_dim", c.conv_kernel}})
    positive(twhere, k, v);
  if (c.n_heads % c.n_kv_heads) fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", twhere, c.n_heads, c.n_kv_heads);
  if (c.lin_v_heads % c.lin_k_heads)
    fail("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", twhere, c.lin_v_heads, c.lin_k_heads);

  // RoPE: rope_parameters (transformers 5) or top-level keys (older saves); rope_scaling is legacy.
  double partial = r.num_opt("partial_rotary_factor", 1.0);
  c.rope_theta = r.num_opt("rope_theta", 10000.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto* rp = r.find(key);
    if (!rp) continue;
    if (!rp->is_object()) fail("{}: field '{}' must be an object", twhere, key);
    Reader rr{*rp, twhere + " (" + key + ")"};
    partial = rr.num_opt("partial_rotary_factor", partial);
    c.rope_theta = rr.num_opt("rope_theta", c.rope_theta);
    auto* type = rr.find("rope_type");
    if (!type) type = rr.find("type");
    if (type && type->is_string()) {
      auto t = type->get<std::string>();
      if (t != "default" && t != "mrope")
        fail("{}: {}.rope_type '{}' is not supported (only default RoPE)", twhere, key, t);
    }
  }
  if (!(partial > 0.0 && partial <= 1.0))
    fail("{}: partial_rotary_factor {} must be in (0, 1]", twhere, partial);
  double rd = double(c.head_dim) * partial;
  c.rotary_dim = int64_t(rd);
  if (c.rotary_dim <= 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2 || std::fabs(rd - double(c.rotary_dim)) > 1e-9)
    fail("{}: head_dim {} x partial_rotary_factor {} must give an even rotary dimension", twhere, c.head_dim, partial);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) fail("{}: rope_theta must be a positive finite number", twhere);
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) fail("{}: rms_norm_eps {} must be in (0, 1)", twhere, c.rms_eps);

  // Layer kinds.
  if (auto* lt = r.find("layer_types")) {
    if (!lt->is_array()) fail("{}: 'layer_types' must be a list", twhere);
    if (int64_t(lt->size()) != c.layers)
      fail("{}: 'layer_types' has {} entries but num_hidden_layers is {}", twhere, lt->size(), c.layers);
    for (auto& t : *lt) {
      auto s = t.is_string() ? t.get<std::string>() : std::string();
      if (s == "linear_attention") c.layer_kinds.push_back(LayerKind::LinearAttention);
      else if (s == "full_attention") c.layer_kinds.push_back(LayerKind::FullAttention);
      else fail("{}: 'layer_types' entry '{}' is neither linear_attention nor full_attention", twhere, t.is_string() ? s : t.dump());
    }
  } else {
    int64_t interval = r.int_opt("full_attention_interval", 4);
    positive(twhere, "full_attention_interval", interval);
    for (int64_t i = 0; i < c.layers; ++i)
      c.layer_kinds.push_back((i + 1) % interval == 0 ? LayerKind::FullAttention : LayerKind::LinearAttention);
  }

  // MoE vs dense MLP per layer.
  std::vector<int64_t> mlp_only;
  if (auto* m = r.find("mlp_only_layers")) {
    if (!m->is_array()) fail("{}: 'mlp_only_layers' must be a list", twhere);
    for (auto& x : *m) {
      if (!x.is_number_integer()) fail("{}: 'mlp_only_layers' must hold integers", twhere);
      mlp_only.push_back(x.get<int64_t>());
    }
  }
  int64_t sparse_step = r.int_opt("decoder_sparse_step", 1);
  for (int64_t i = 0; i < c.layers; ++i) {
    bool only = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
    bool moe = !only && c.n_experts > 0 && sparse_step > 0 && (i + 1) % sparse_step == 0;
    if (c.arch == Arch::Qwen35Moe) moe = c.n_experts > 0 && !only;
    if (c.arch == Arch::Qwen35) moe = false;
    c.layer_is_moe.push_back(moe);
    if (moe) {
      if (c.top_k <= 0 || c.top_k > c.n_experts)
        fail("{}: num_experts_per_tok {} must be in [1, num_experts={}]", twhere, c.top_k, c.n_experts);
      positive(twhere, "moe_intermediate_size", c.moe_inter);
    } else {
      positive(twhere, "intermediate_size", c.dense_inter);
    }
  }

  for (const nlohmann::json* d : {r.find("dtype"), r.find("torch_dtype"), Reader{top, where}.find("dtype"),
                                  Reader{top, where}.find("torch_dtype")}) {
    if (!d || !d->is_string()) continue;
    const auto s = d->get<std::string>();
    if (s == "bfloat16") c.rope_freq_dtype = DType::BF16;
    else if (s == "float16") c.rope_freq_dtype = DType::F16;
    else if (s == "float32") c.rope_freq_dtype = DType::F32;
    else fail("{}: dtype '{}' is not one of bfloat16, float16, float32", twhere, s);
    break;
  }

  for (const char* key : {"mtp_num_hidden_layers", "num_nextn_predict_layers"}) {
    if (!r.find(key)) continue;
    c.mtp_layers = r.int_req(key);
    c.mtp_field = key;
    if (c.mtp_layers < 0) fail("{}: field '{}' must not be negative (got {})", twhere, key, c.mtp_layers);
    if (c.mtp_layers > 1)
      fail("{}: field '{}' is {}; lily runs checkpoints with one MTP layer (0 or 1)", twhere, key, c.mtp_layers);
    break;
  }

  c.eos_ids = ids_of(r.find("eos_token_id"));
  if (c.eos_ids.empty()) c.eos_ids = ids_of(top.contains("eos_token_id") ? &top["eos_token_id"] : nullptr);

  for (const nlohmann::json* q : {r.find("quantization"), r.find("quantization_config"),
                                  top.contains("quantization") ? &top["quantization"] : nullptr,
                                  top.contains("quantization_config") ? &top["quantization_config"] : nullptr}) {
    if (q && q->is_object()) {
      c.quantization = *q;
      auto m = q->find("quant_method");
      if (m != q->end() && !m->is_string()) fail("{}: field 'quant_method' of the quantization object must be a string", where);
      c.quant_method = m != q->end() ? m->get<std::string>() : std::string(q->contains("bits") ? "affine" : "");
      break;
    }
  }
  return c;
}

ModelConfig ModelConfig::load(const std::string& dir) {
  namespace fs = std::filesystem;
  auto path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path)) fail("{}: no config.json", dir);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  ModelConfig c = from_json(j, path);
  auto gen = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen)) {
    try {
      auto g = nlohmann::json::parse(read_text_file(gen));
      auto ids = ids_of(g.contains("eos_token_id") ? &g["eos_token_id"] : nullptr);
      if (!ids.empty()) c.eos_ids = ids;
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", gen, e.what());
    }
  }
  return c;
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json kinds = nlohmann::json::array();
  for (auto k : layer_kinds) kinds.push_back(k == LayerKind::FullAttention ? "full_attention" : "linear_attention");
  return {{"architecture", arch_name(arch)},
          {"model_type", model_type},
          {"hidden_size", hidden},
          {"num_layers", layers},
          {"num_full_attention_layers", n_full_layers()},
          {"num_linear_attention_layers", n_linear_layers()},
          {"vocab_size", vocab},
          {"attention", {{"heads", n_heads}, {"kv_heads", n_kv_heads}, {"head_dim", head_dim}, {"rotary_dim", rotary_dim}, {"rope_theta", rope_theta}}},
          {"linear_attention", {{"key_heads", lin_k_heads}, {"value_heads", lin_v_heads}, {"key_dim", lin_k_dim}, {"value_dim", lin_v_dim}, {"conv_kernel", conv_kernel}}},
          {"moe", n_moe_layers() == 0 ? nlohmann::json(nullptr)
                                       : nlohmann::json{{"experts", n_experts}, {"top_k", top_k}, {"expert_intermediate", moe_inter},
                                                        {"shared_intermediate", shared_inter}, {"norm_topk_prob", norm_topk},
                                                        {"layers", n_moe_layers()}}},
          {"dense_mlp", n_moe_layers() == layers ? nlohmann::json(nullptr)
                                                 : nlohmann::json{{"intermediate", dense_inter}, {"layers", layers - n_moe_layers()}}},
          {"tie_word_embeddings", tie_embeddings},
          {"layer_types", kinds},
          {"quantization", quant_method.empty() ? nlohmann::json(nullptr) : nlohmann::json(quant_method)}};
}

}  // namespace lily
