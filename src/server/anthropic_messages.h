// POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API. Content blocks (text,
// tool_use, tool_result, thinking) become the template's messages; tool_choice any / tool forces a call
// through the output constraint; thinking maps to the template's enable_thinking and a token budget;
// replies and the streamed event sequence follow Anthropic's shapes, errors its envelope.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "server/chat_prompt.h"
#include "server/core.h"
#include "server/structured.h"

namespace lily::server {

struct MessagesRequest {
  json messages;   // the template's shape (OpenAI roles, tool_calls with parsed arguments)
  json tools;      // OpenAI shape; empty when tool_choice is none
  json kwargs;     // enable_thinking
  SamplingParams sampling;
  std::vector<std::string> stops;
  std::optional<int64_t> max_tokens;
  bool stream = false;
  OutputConstraint constraint;
  int max_tool_calls = 0;  // tool_choice auto with disable_parallel_tool_use: 1 (the reply ends after it)
};

// A pure function of the body (count_only: the count_tokens subset, no max_tokens). FieldError naming
// the field ("messages.1.content.0.type") on bad input.
MessagesRequest parse_messages_request(const json& body, const RequestLimits& limits, bool count_only);

// Anthropic's error envelope: {"type": "error", "error": {"type": ..., "message": ...}}.
json anthropic_error_body(const ApiError& e);

void register_anthropic_messages(Core& core, std::shared_ptr<Structured> structured);

}  // namespace lily::server
