// One request on one session, on the calling thread: the generation loop (runtime/loop.h) with a single
// sequence. Same tokens, end conditions and end state as the server's requests (runtime/request.h):
// afterwards the session holds the prompt and every emitted token that fits, the stop id included.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace lily {

// GenParams's prompt field is not read here: the prompt is generate()'s argument.
using GenerateOptions = GenParams;

struct GenerateResult {
  std::vector<int32_t> tokens;    // generated ids (the stop id that ended it included)
  std::string finish_reason;      // "stop" (stop id or callback), "length" (max_tokens or context full)
  int64_t prompt_tokens = 0;      // prompt tokens actually prefilled
  double prefill_seconds = 0, decode_seconds = 0;
  bool device_sampled = false;    // the backend's sampler drew the tokens
  SpecStats spec;                 // speculative rounds (GenParams::spec)
};

// Called after each emitted token (not for a stop id) with its logits row (empty when it was drawn on the
// device; set GenParams::token_logits to get rows); return false to stop.
using TokenCallback = std::function<bool(int32_t token, std::span<const float> logits)>;

// The device form of sampling parameters (validated; an unset seed drawn from std::random_device).
DeviceSampling device_sampling(const SamplingParams& p);
// The inverse (seed set): what a host Sampler needs to draw like the device request.
SamplingParams host_sampling(const DeviceSampling& d);

// Appends `prompt` to the session (which may already hold a prefix) and generates. Throws InputError for
// a bad request (token ids, context overflow, sampling parameters).
GenerateResult generate(Session& s, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const TokenCallback& on_token = {});

}  // namespace lily
