// POST /v1/completions (and /completions): OpenAI legacy completions over a text or token-id prompt.
#pragma once
#include <string>
#include <vector>

#include "server/core.h"
#include "server/openai_common.h"

namespace lily::server {

struct CompletionRequest {
  OpenAiSampling common;
  bool prompt_is_text = false;
  std::string prompt_text;           // when prompt_is_text
  std::vector<int32_t> prompt_ids;   // otherwise (not yet checked against the vocabulary)
  bool echo = false;
  int logprobs = -1;                 // -1: none; else the number of alternatives per token
  bool return_tokens = false;
};

// A pure function of the body: FieldError naming the field on bad input.
CompletionRequest parse_completion_request(const json& body, const RequestLimits& limits);

void register_openai_completions(Core& core);

}  // namespace lily::server
