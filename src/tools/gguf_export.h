// Export a model as a llama.cpp GGUF, laid out as llama.cpp's own converter (convert_hf_to_gguf.py,
// conversion/qwen.py) writes Qwen3-Next (`qwen3next`) and Qwen3.5-MoE (`qwen35moe`):
//  - tensor names blk.N.{attn_norm, post_attention_norm, attn_q/k/v/output, attn_q_norm/k_norm,
//    attn_qkv, attn_gate, ssm_conv1d, ssm_dt.bias, ssm_a, ssm_norm, ssm_out, ssm_ba (qwen3next) or
//    ssm_beta + ssm_alpha (qwen35moe), ffn_gate_inp, ffn_{gate,up,down}_exps, ffn_*_shexp,
//    ffn_gate_inp_shexp}, token_embd, output_norm, output;
//  - zero-centred norms stored as (1 + w); linear_attn.norm stored plain; ssm_a = -exp(A_log);
//  - qwen3next: in_proj_qkvz split into attn_qkv (q‖k‖v flat) + attn_gate (z), in_proj_ba as stored;
//  - qwen35moe: value heads permuted from HF's grouped order (j = g·r + i) to the tiled order
//    (position i·Hk + g) in attn_qkv's v rows, attn_gate, ssm_beta/alpha, ssm_a, ssm_dt, the conv's v
//    channels and ssm_out's columns (model doc §2.5);
//  - 1-D tensors, norms, routers, the shared-expert gate and the conv kernel in F32; other matrices in
//    the requested type (rows not a multiple of 32 fall back to BF16 for q8_0/q4_0);
//  - tokenizer metadata from DIR/tokenizer.json when present, else a synthetic byte-level BPE vocab
//    (256 byte tokens + filler, no merges) so llama.cpp loads the file and can be fed token ids;
//  - the MTP block, when the model has one, as layer blk.{n_layer} (block_count n_layer + 1,
//    `nextn_predict_layers` 1, not recurrent) with blk.N.nextn.{eh_proj, enorm, hnorm, shared_head_norm}
//    for mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm}.
#pragma once
#include <memory>
#include <string>

#include "model/weights.h"
#include "tools/gguf.h"

namespace lily {

struct GgufExportOptions {
  gguf::TensorType type = gguf::TensorType::BF16;  // F32, BF16, Q8_0 or Q4_0
  std::string model_dir;  // for tokenizer.json / tokenizer_config.json / config.json extras ("" = none)
  std::string name;       // general.name
  bool progress = false;  // tensor names on stderr
  bool mtp = true;        // write the MTP block when the model has one (llama.cpp's converter: --no-mtp)
};

// Parses "f32" | "bf16" | "q8_0" | "q4_0"; throws InputError naming `--type`.
gguf::TensorType parse_gguf_type(const std::string& s);

// Writes `out`. Throws InputError for weights it cannot export (quantized formats) or I/O failures.
void export_gguf(const ModelWeights& w, const std::string& out, const GgufExportOptions& opt);

// The permutation of value heads llama.cpp's qwen35moe expects: result[p] = HF head at tiled position p.
std::vector<int64_t> tiled_value_heads(int64_t k_heads, int64_t v_heads);

}  // namespace lily
