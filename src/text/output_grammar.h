// Grammars for what a Qwen chat model writes when its output is constrained: an optional reasoning
// block (<think>...</think>), then either a JSON document (structured outputs) or tool calls in the
// model's syntax (forced tool calls). The markup is the one output_parser reads back.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "text/grammar.h"

namespace lily::text {

enum class ReasoningMode {
  None,      // no <think> block (the prompt closed it, or the model does not reason)
  Optional,  // the output may start with <think>...</think>
  Open,      // the prompt ended inside <think>: the output starts with reasoning, then </think>
};

// The mode a rendered prompt calls for: Open when it leaves <think> open, None when its generation
// prompt already holds a closed (empty) think block, else Optional when `thinking` is on.
ReasoningMode reasoning_mode(const std::string& prompt, bool thinking);

enum class ToolCallSyntax {
  Json,  // Qwen3:   <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
  Xml,   // Qwen3.5: <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
};

struct ToolCallGrammarOptions {
  ToolCallSyntax syntax = ToolCallSyntax::Json;
  nlohmann::ordered_json tools;  // OpenAI shape: [{"type": "function", "function": {name, parameters}}]
  std::string only;              // the one function to call; empty: any of `tools`
  int max_calls = 1;             // calls in one reply (at least one)
  ReasoningMode reasoning = ReasoningMode::None;
  std::string schema_where = "tools[{}].function.parameters";  // a tool's schema in errors ({}: its index)
};

// One or more tool calls and nothing else (after the reasoning block). InputError names the tool and
// the schema location when a tool or its parameters are malformed.
Grammar tool_call_grammar(const ToolCallGrammarOptions& opt);

// A JSON document after the reasoning block: matching `schema` (`where` names it in errors), or any
// object when `schema` is null.
Grammar json_output_grammar(const nlohmann::ordered_json& schema, const std::string& where, ReasoningMode reasoning);

}  // namespace lily::text
