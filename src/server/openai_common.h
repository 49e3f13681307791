// What the OpenAI chat and completions APIs share: the sampling fields, the model check, and the
// usage / timings objects of their replies.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "server/fields.h"
#include "server/job.h"

namespace lily::server {

class Core;

struct OpenAiSampling {
  SamplingParams sampling;
  std::vector<std::string> stops;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens
  bool stream = false, include_usage = false;
  bool cache_prompt = true;  // llama.cpp's field: false skips the prompt cache for this request
  std::optional<SpecMode> spec;    // `spec`: "mtp" | "ngram" | "off"
  std::optional<int> spec_depth;   // `spec_depth`: 1..16 or "auto" (0)
};

// temperature, top_p, top_k, min_p, penalties, seed, n, stop, logit_bias, max(_completion)_tokens,
// stream, stream_options, cache_prompt, spec, spec_depth. FieldError naming the field.
OpenAiSampling parse_openai_sampling(const json& body, const RequestLimits& limits);

// The request's speculation: the server's default with the request's fields over it; FieldError("spec")
// naming the missing tensors for "mtp" on a model without the MTP block.
SpecParams request_spec(const OpenAiSampling& c, const Core& core);

// 404 (ApiError) when the body names a model other than `served`; FieldError when `model` is not a string.
void check_model(const json& body, const std::string& served);

json usage_json(const GenResult& r, int reasoning_tokens);
// llama.cpp's `timings` object, from a job's Final event. predicted_ms is the wall time from the first
// generated token to the last (what the client saw), predicted_per_second the token gaps over it.
json timings_json(const Event& fin);

// A token's bytes as a JSON array of byte values, and as text (ill-formed UTF-8 shown as U+FFFD).
json bytes_json(const std::string& b);
std::string piece_text(const LogprobItem& it);

}  // namespace lily::server
