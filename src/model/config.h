// ModelConfig: the text model's hyperparameters, resolved from any of the config.json forms
// (qwen3_next; qwen3_5_moe_text; qwen3_5_moe with text_config; the dense qwen3_5_text and qwen3_5
// with text_config; RoPE at top level or in rope_parameters; layer_types or full_attention_interval;
// mlp_only_layers / decoder_sparse_step).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace lily {

// Qwen35: the dense Qwen3.5 family (a SwiGLU MLP of intermediate_size in every layer, no experts).
enum class Arch { Qwen3Next, Qwen35Moe, Qwen35 };
enum class LayerKind { LinearAttention, FullAttention };

struct ModelConfig {
  Arch arch = Arch::Qwen35Moe;
  std::string model_type;      // as written in the file (top level)
  std::string tensor_prefix;   // "model." or "model.language_model."
  int64_t hidden = 0, layers = 0, vocab = 0;
  double rms_eps = 1e-6;
  // full attention
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, rotary_dim = 0;
  double rope_theta = 10000.0;
  // Precision of the RoPE inverse frequencies: the checkpoint's `dtype` (HF holds the inv_freq buffer
  // in the model's dtype once the model is cast to it; F32 when the config names none).
  DType rope_freq_dtype = DType::F32;
  // gated deltanet
  int64_t lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, conv_kernel = 0;
  // moe
  int64_t n_experts = 0, top_k = 0, moe_inter = 0, shared_inter = 0, dense_inter = 0;
  bool norm_topk = true;
  bool tie_embeddings = false;
  int64_t max_positions = 0;
  std::vector<LayerKind> layer_kinds;
  std::vector<bool> layer_is_moe;  // false: dense MLP of dense_inter
  std::vector<int64_t> eos_ids;     // from config / generation_config
  // MTP layers declared by config.json: `mtp_num_hidden_layers` (Qwen3.5) or `num_nextn_predict_layers`;
  // -1 when it names neither (Qwen3-Next releases: the checkpoint's mtp.* tensors decide). mtp_field
  // names the field that was read, for messages.
  int64_t mtp_layers = -1;
  std::string mtp_field;
  std::string quant_method;         // "" for plain float checkpoints
  nlohmann::json quantization;      // raw quantization block when present

  // Derived sizes.
  int64_t lin_key_dim() const { return lin_k_heads * lin_k_dim; }
  int64_t lin_value_dim() const { return lin_v_heads * lin_v_dim; }
  int64_t conv_channels() const { return 2 * lin_key_dim() + lin_value_dim(); }
  int64_t n_full_layers() const;
  int64_t n_moe_layers() const;
  int64_t n_linear_layers() const { return layers - n_full_layers(); }

  // Parses config.json text; `where` names the file in errors.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where);
  // Reads DIR/config.json (and DIR/generation_config.json for stop ids when present).
  static ModelConfig load(const std::string& dir);
  nlohmann::json to_json() const;  // summary for `lily info --json`
};

const char* arch_name(Arch a);

}  // namespace lily
