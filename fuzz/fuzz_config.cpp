// config.json text -> ModelConfig::from_json (every form: qwen3_next, qwen3_5_moe(_text), text_config,
// rope_parameters, layer_types, mlp_only_layers, quantization) -> to_json. Accepted configs must be
// self-consistent: one layer kind and one MoE flag per layer, rotary dimension within the head.
#include "fuzz_common.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto text = lily::fuzz::as_text(data, size);
  auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    auto c = lily::ModelConfig::from_json(j, "config.json");
    LILY_FUZZ_REQUIRE(int64_t(c.layer_kinds.size()) == c.layers && int64_t(c.layer_is_moe.size()) == c.layers);
    LILY_FUZZ_REQUIRE(c.rotary_dim > 0 && c.rotary_dim <= c.head_dim && c.rotary_dim % 2 == 0);
    LILY_FUZZ_REQUIRE(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0);
    (void)c.to_json().dump();
  } catch (const lily::InputError&) {
  }
  return 0;
}
