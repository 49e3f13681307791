// What every chat API does between its schema and the scheduler: render the template-shaped messages
// with the generation prompt, tokenize, mark the last message boundary for the prompt cache, and (for
// structured outputs and forced tool calls) build the constraint the reply must follow.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "server/core.h"
#include "server/structured.h"

namespace lily::server {

struct ChatPrompt {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<size_t> boundaries;  // where the last message starts and ends, ascending (prompt cache)
};

// FieldError(param, template_error) when the template refuses the messages.
ChatPrompt render_chat_prompt(const Core& core, const json& messages, const json& tools, const json& kwargs, const char* param);

// What the reply must be, beyond free text.
struct OutputConstraint {
  enum Kind { None, JsonObject, JsonSchema, ToolCall } kind = None;
  json schema;              // JsonSchema
  std::string where;        // the request field holding the schema (FieldError names it)
  std::string only;         // ToolCall: the one function; empty: any of the tools
  int max_calls = 1;        // ToolCall
  static constexpr int kMaxForcedCalls = 8;  // a forced tool choice that allows parallel calls
  std::string tool_schema_where = "tools[{}].function.parameters";  // ToolCall: a tool's schema in errors
  std::optional<int64_t> thinking_budget;
};

// The constraint for `c` on a reply to `prompt` (null when there is nothing to constrain; `s` may be
// null then). `thinking`: the template's thinking switch. FieldError naming c.where when the schema is
// malformed.
std::shared_ptr<TokenConstraint> output_constraint(Structured* s, const OutputConstraint& c, const json& tools,
                                                   const std::string& prompt, bool thinking, int64_t max_tokens);

// The template variable enable_thinking as the kwargs set it (absent: on, the Qwen templates' default).
bool thinking_enabled(const json& kwargs);

}  // namespace lily::server
