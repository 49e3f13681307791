// POST /v1/chat/completions (and /chat/completions): OpenAI chat completions, streamed or not.
#pragma once
#include "server/chat_prompt.h"
#include "server/core.h"
#include "server/openai_common.h"
#include "server/structured.h"

namespace lily::server {

struct ChatRequest {
  OpenAiSampling common;
  bool logprobs = false;
  int top_logprobs = 0;
  bool return_tokens = false;  // llama.cpp's field: the generated ids in the reply
  json messages;               // in the chat template's shape (roles mapped, text parts joined, arguments parsed)
  json tools;                  // the tools the template sees, after tool_choice (none: empty)
  json kwargs;                 // template variables (chat_template_kwargs, enable_thinking)
  OutputConstraint constraint; // response_format json_object / json_schema, tool_choice required / named
  int max_tool_calls = 0;      // parallel_tool_calls false: 1 (the reply ends after its first call)
};

// A pure function of the body: FieldError naming the field on bad input.
ChatRequest parse_chat_request(const json& body, const RequestLimits& limits);

// `structured` may be null (no tokenizer): then nothing is constrained.
void register_openai_chat(Core& core, std::shared_ptr<Structured> structured);

}  // namespace lily::server
