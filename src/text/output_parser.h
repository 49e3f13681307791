// Incremental parsing of generated text into content, reasoning and tool calls. Feed the decoded text
// as it streams (any chunking); tags (<think>, </think>, <tool_call>, </tool_call>, <function=...>)
// never reach content or reasoning, partial tags are held back until they resolve.
// A tool call written inside a <think> block (or right after <think>, never closed) is parsed as a
// call and the block resumes after it, so neither the call nor the reasoning reaches content.
// Tool calls: Qwen3 JSON form  <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//             Qwen3.5 / Qwen3-Coder XML form  <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n
//             </parameter>\n</function>\n</tool_call>  (the <tool_call> wrapper may be missing).
// Arguments are coerced to the JSON types the tool's schema declares.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily::text {

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
  std::string raw;  // the call's text as generated, without the <tool_call> wrapper
};

struct ParsedDelta {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(ParsedDelta&& o);
};

struct OutputParserOptions {
  bool parse_reasoning = true;       // split <think>...</think> into reasoning
  bool start_in_reasoning = false;   // the prompt ended inside an open <think> (see prompt_opens_thinking)
  bool parse_tool_calls = true;      // recognise tool calls (normally: when the request has tools)
  nlohmann::ordered_json tools = nullptr;  // the request's tools (OpenAI format) for argument coercion
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions opts = {});
  ParsedDelta feed(std::string_view text);
  // End of generation: releases held text; an unterminated tool call is parsed if it can be, otherwise
  // its text becomes content.
  ParsedDelta finish();
  bool in_reasoning() const { return mode_ == Mode::Reasoning; }
  bool in_tool_call() const { return mode_ == Mode::Tool; }

 private:
  enum class Mode { Content, Reasoning, Tool };
  void step(ParsedDelta& d, bool final);
  void emit_content(ParsedDelta& d, std::string_view s);
  void emit_reasoning(ParsedDelta& d, std::string_view s, bool final);
  void close_tool(ParsedDelta& d, bool terminated);

  OutputParserOptions opts_;
  Mode mode_ = Mode::Content;
  std::string buf_;              // text not yet consumed
  std::string tool_text_;        // body of the current tool call
  bool tool_bare_ = false;       // current call started at <function= without <tool_call>
  bool tool_in_reasoning_ = false;  // current call started inside <think> (reasoning resumes after it)
  bool content_started_ = false; // non-whitespace content emitted since the last think/tool block
  bool strip_content_ws_ = false;// drop whitespace before the next content (after </think> or a call)
  bool reasoning_started_ = false;
  std::string held_ws_;          // trailing whitespace of content or reasoning, not yet emitted
};

// True when the rendered prompt leaves a <think> block open (generation starts inside reasoning).
bool prompt_opens_thinking(std::string_view prompt);

// Parses one tool call body (the text between <tool_call> and </tool_call>, JSON or XML form);
// nullopt when it is not a well-formed call.
std::optional<ToolCall> parse_tool_call(std::string_view body, const nlohmann::ordered_json& tools = nullptr);

// The parameters schema ({"type": "object", "properties": ...}) of tool `name`, or null.
nlohmann::ordered_json tool_parameters(const nlohmann::ordered_json& tools, const std::string& name);

// Coerces a value to a JSON-schema type ("string", "integer", "number", "boolean", "object", "array",
// "null", or a list of them); values that do not convert are returned unchanged.
nlohmann::ordered_json coerce_to_schema(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema);

}  // namespace lily::text
