// ModelWeights: the checkpoint mapped onto our names. All checkpoint quirks are resolved here, once:
// prefixes, both expert layouts, Qwen3-Next's grouped in_proj_qkvz / in_proj_ba regrouped to the flat
// q‖k‖v / z / b / a order, zero-centred norms folded to (1 + w) in fp32, tied embeddings.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/linear.h"

namespace lily {

struct Expert {
  Linear gate, up, down;  // [I, H], [I, H], [H, I]
};

struct GdnWeights {
  Linear in_qkv;   // [2·Hk·dk + Hv·dv, H], rows q‖k‖v flat
  Linear in_z;     // [Hv·dv, H]
  Linear in_b;     // [Hv, H]
  Linear in_a;     // [Hv, H]
  std::vector<float> conv;     // [C, K]; conv[c*K + j] multiplies input K-1-j steps back
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> A_neg;    // [Hv] = -exp(A_log)
  std::vector<float> norm;     // [dv] plain weight (no +1)
  Linear out;      // [H, Hv·dv]
};

struct AttnWeights {
  Linear q;        // [Hq·2·hd, H] per-head interleaved query | gate
  Linear k, v;     // [Hkv·hd, H]
  Linear o;        // [H, Hq·hd]
  std::vector<float> q_norm, k_norm;  // [hd], folded (1 + w)
};

struct FfnWeights {
  bool moe = true;
  Linear router;                // [E, H]
  std::vector<Expert> experts;  // E; a rank's share (model/shard.h): experts [expert0, expert0 + size) of the router's E
  int64_t expert0 = 0;
  Expert shared;                // shared expert (MoE) or the dense MLP (moe == false)
  Linear shared_gate;           // [1, H]; empty for dense MLP
};

struct LayerWeights {
  LayerKind kind;
  std::vector<float> input_norm, post_norm;  // [H], folded (1 + w)
  GdnWeights gdn;
  AttnWeights attn;
  FfnWeights ffn;
};

// The multi-token-prediction block (model doc §5, checkpoint names mtp.*): z = fc([norm_e(embed[x]) ‖
// norm_h(h)]), one full-attention decoder layer over z with its own KV cache, h' = norm(z), logits through
// the shared lm_head. The layer is an ordinary LayerWeights, so every backend runs it with its attention
// and FFN code.
struct MtpWeights {
  std::string prefix;                          // checkpoint prefix of its tensors ("mtp.")
  std::vector<float> norm_embed, norm_hidden;  // [H], folded (1 + w): pre_fc_norm_embedding / _hidden
  Linear fc;                                   // [H, 2H]; input columns: embedding half first
  LayerWeights layer;                          // FullAttention; MoE, or the dense MLP of a dense model
  std::vector<float> final_norm;               // [H], folded: mtp.norm
};

struct ModelWeights {
  ModelConfig cfg;
  Linear embed;                // [V, H] (gathered, never multiplied)
  Linear lm_head;              // [V, H]
  std::vector<float> final_norm;  // [H], folded
  std::vector<float> rope_inv_freq;  // [rotary_dim / 2]: theta^(-2i/rotary_dim), rounded to cfg.rope_freq_dtype
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;  // empty when the checkpoint carries no mtp.* tensors
  std::string mtp_absent;         // when empty: why, naming the missing tensors (and config field)

  // A rank's share of a model split over several devices (model/shard.h): cfg holds the rank's head counts,
  // lm_head its vocabulary rows [vocab0, vocab0 + lm_head.out) of cfg.vocab; ranks == 1: the whole model.
  int rank = 0, ranks = 1;
  int64_t vocab0 = 0;

  std::shared_ptr<Checkpoint> ckpt;  // keeps the mappings alive
  std::vector<std::shared_ptr<void>> owned;  // buffers made at load time (regrouped matrices, ...)

  // Loads DIR (config.json + safetensors). Throws InputError naming the file/tensor/field.
  static std::shared_ptr<ModelWeights> load(const std::string& dir);
  static std::shared_ptr<ModelWeights> load(const ModelConfig& cfg, std::shared_ptr<Checkpoint> ckpt);

  // The MTP block, for callers that need it (speculative drafts, `lily logits --mtp`); throws
  // InputError naming the missing tensors when the checkpoint has none.
  const MtpWeights& require_mtp() const;

  size_t weight_bytes() const;              // all matrices of the main model, as stored
  size_t active_bytes_per_token() const;    // weights read per decoded token (top-k experts)
  size_t mtp_weight_bytes() const;          // matrices of the MTP block (0 without one)
  size_t mtp_active_bytes_per_token() const;  // read per MTP draft (top-k experts; lm_head not counted)
};

}  // namespace lily
