// The decode loop: prefill a prompt on a session, then sample token by token until a stop id,
// max_tokens, a full context, or the callback says stop.
//
// Two paths with the same emitted tokens semantics (which tokens, which finish reason):
//  - device (the backend can_decode_on_device(), e.g. CUDA, and !need_logits): sampling runs on the
//    device inside the decode step, the host only receives ids. The session ends after every emitted
//    token that fit, the last one included (s.tokens() == prompt + tokens unless the context filled).
//  - host (otherwise): logits come to the host each step and runtime/sampler.h draws. The last emitted
//    token is not absorbed (s.tokens() == prompt + tokens[0:n-1]).
// Either way s.tokens() and s.last_logits() describe the state exactly. A seed reproduces the tokens
// of its path (the device draws with its own counter-based generator).
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
  bool need_logits = false;       // the callback reads each token's logits row: forces the host path
  bool allow_device = true;       // false: always the host path
};

struct GenerateResult {
  std::vector<int32_t> tokens;    // generated ids
  std::string finish_reason;      // "stop" (stop id or callback), "length" (max_tokens or context full)
  int64_t prompt_tokens = 0;      // prompt tokens actually prefilled (after any cached prefix)
  double prefill_seconds = 0, decode_seconds = 0;
};

// Called after each sampled token with its logits row (V floats; empty on the device path, see
// GenerateOptions::need_logits); return false to stop.
using TokenCallback = std::function<bool(int32_t token, std::span<const float> logits)>;

// The device form of sampling parameters (validated; an unset seed drawn from std::random_device).
DeviceSampling device_sampling(const SamplingParams& p);
// The inverse (seed set): what a host Sampler needs to draw like the device request.
SamplingParams host_sampling(const DeviceSampling& d);

// Appends `prompt` to the session (which may already hold a cached prefix) and generates.
GenerateResult generate(Session& s, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const TokenCallback& on_token = {});

}  // namespace lily
