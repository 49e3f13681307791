// POST /v1/responses (OpenAI Responses), GET and DELETE /v1/responses/{id}. Input items (messages,
// function_call, function_call_output, reasoning) become the template's messages; previous_response_id
// continues a stored conversation (bounded store; the prompt cache holds its state); text.format and
// tool_choice required / a named function go through the output constraint; streamed as typed events.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "server/chat_prompt.h"
#include "server/core.h"
#include "server/response_store.h"
#include "server/structured.h"

namespace lily::server {

struct ResponsesRequest {
  json input;         // the template's messages from `input` (no instructions)
  std::string instructions;
  bool has_instructions = false;
  std::string previous_response_id;
  json tools;         // OpenAI chat shape; empty when tool_choice is none
  json tools_echo;    // as given, for the response object
  json tool_choice = "auto";
  json kwargs;        // enable_thinking from reasoning.effort
  json reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  json text_format = {{"type", "text"}};
  SamplingParams sampling;
  std::optional<int64_t> max_output_tokens;
  bool stream = false, store = true, parallel_tool_calls = true;
  json metadata = json::object();
  OutputConstraint constraint;
};

// A pure function of the body: FieldError naming the field ("input[2].call_id") on bad input.
ResponsesRequest parse_responses_request(const json& body, const RequestLimits& limits);

void register_openai_responses(Core& core, std::shared_ptr<Structured> structured, std::shared_ptr<ResponseStore> store);

}  // namespace lily::server
