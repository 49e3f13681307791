// The decode loop: prefill a prompt on a session, then sample token by token until a stop id,
// max_tokens, or the callback says stop.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"

namespace lily {

struct GenerateOptions {
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these (it is included)
  bool penalize_prompt = false;   // whether penalties see the prompt tokens too
};

struct GenerateResult {
  std::vector<int32_t> tokens;    // generated ids
  std::string finish_reason;      // "stop" (stop id or callback), "length" (max_tokens or context full)
  int64_t prompt_tokens = 0;      // prompt tokens actually prefilled (after any cached prefix)
  double prefill_seconds = 0, decode_seconds = 0;
};

// Called after each sampled token with its logits row (V floats); return false to stop.
using TokenCallback = std::function<bool(int32_t token, std::span<const float> logits)>;

// Appends `prompt` to the session (which may already hold a cached prefix) and generates.
GenerateResult generate(Session& s, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const TokenCallback& on_token = {});

}  // namespace lily
