// Synthetic models: random weights of the real architectures, for speed measurements and for machines
// whose disk cannot hold a real checkpoint. Weights are drawn straight into the target format:
//   bf16     matrices U(-a, a), a = sqrt(3 / in) (unit-variance outputs for unit-variance inputs)
//   affine   MLX affine, group 64: random code words (every bit pattern is a valid code stream) with
//            scale 2a / (2^bits - 1) and bias -a, so dequantised weights are uniform on [-a, a]
//   exl3     random trellis words, suh = ±1, svh = ±1 / (sqrt(in) · codebook std) (exllamav3 keeps the
//            routers, shared-expert gate, GDN b/a projections and the embedding in 16-bit; lm_head at 6 bits)
// Routers have rows of equal norm (unit logit variance for unit inputs), so for isotropic hidden states
// every expert is equally likely and top-k spreads over all experts; router_spread() measures it.
// The in-memory builder and the on-disk writer draw every tensor from the same seeded stream (a hash of
// the seed and the tensor name), so `lily bench --synth P --format F` runs the model `lily synth` writes.
// Every preset carries an MTP block (mtp.*, random like the rest, in the same format as the layers).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "quant/exl3/exl3.h"

namespace lily {

enum class SynthFormat { BF16, Affine4, Affine8, Exl3 };

struct SynthOptions {
  std::string preset;                 // one of synth_presets()
  SynthFormat format = SynthFormat::BF16;
  int exl3_bits = 4;                  // K for exl3 (2..8)
  quant::Exl3Codebook codebook = quant::Exl3Codebook::Mcg;
  uint64_t seed = 1;
  int64_t layers = 0;                 // decoder layers (full attention every fourth); 0: the preset's
  // synth_model: the matrices' sizes and formats without their data (null pointers; norms and vectors are
  // drawn): the CUDA backend then draws them on the device at upload (backend/cuda/shard_synth.cu).
  bool shapes_only = false;
  bool progress = false;              // per-layer progress on stderr
};

SynthFormat parse_synth_format(const std::string& s);  // throws InputError naming --format
quant::Exl3Codebook parse_codebook(const std::string& s);  // mcg | mul1 | 3inst
const char* synth_format_name(SynthFormat f);
const std::vector<std::string>& synth_presets();
std::string synth_preset_list();  // "a | b | ...", for help texts

// config.json of the preset and format (HF layout; quantization block for affine / exl3).
nlohmann::json synth_config(const SynthOptions& opt);

// The whole model in memory.
std::shared_ptr<ModelWeights> synth_model(const SynthOptions& opt);

struct SynthWriteResult {
  size_t bytes = 0;
  int shards = 0;
  double seconds = 0;
};
// Writes DIR/config.json, generation_config.json, model-XXXXX-of-YYYYY.safetensors (one shard for
// embeddings / head, one per layer, one for the MTP block) and model.safetensors.index.json. Memory: one
// layer at a time.
SynthWriteResult write_synth(const SynthOptions& opt, const std::string& dir);

// Layer `layer`'s router exactly as synth_model / write_synth draw it (buffers kept in `owned`).
Linear synth_router(const SynthOptions& opt, int64_t layer, std::vector<std::shared_ptr<void>>& owned);

// Top-k routing statistics of one router over `samples` random N(0, 1) hidden states.
struct RouterSpread {
  int64_t experts = 0, top_k = 0, samples = 0;
  int64_t used = 0;              // experts chosen at least once
  double min_share = 0, max_share = 0;  // per-expert count / (samples · top_k / experts)
};
RouterSpread router_spread(const Linear& router, int64_t top_k, int64_t samples, uint64_t seed);

}  // namespace lily
