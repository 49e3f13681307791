// What the server needs from the text layer for chat: the prompt rendered by the model's Jinja chat
// template, and an incremental split of generated text into content, reasoning and tool calls.
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily::server {

// One piece of a streamed tool call, in OpenAI's delta shape: the first piece of call `index`
// carries id and name; later pieces append to `arguments` (concatenated: one JSON object). Calls are
// sent once complete, so each call is one piece holding all of its arguments.
struct ToolCallDelta {
  int index = 0;
  std::string id, name, arguments;
  bool first = false;
};

struct OutputDelta {
  std::string content, reasoning;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(OutputDelta&& d);
};

// The first text of a new block or item (reasoning resumed after a tool call, say) without the newlines
// that separated it from what came before.
inline std::string_view block_start(std::string_view s) { return s.substr(std::min(s.find_first_not_of('\n'), s.size())); }

class OutputStream {
 public:
  virtual ~OutputStream() = default;
  virtual OutputDelta push(std::string_view text) = 0;
  virtual OutputDelta finish() = 0;     // end of generation: whatever is held back
  virtual bool in_reasoning() const = 0;
  virtual int tool_calls() const = 0;   // calls started so far
};

class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  // `messages` and `tools` in OpenAI shape (tool-call arguments already parsed to objects when they
  // were JSON text); `kwargs` are extra template variables (enable_thinking, ...). InputError on bad input.
  virtual std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             const nlohmann::ordered_json& kwargs, bool add_generation_prompt) const = 0;
  // A splitter for the text generated after `prompt`. `tools` (the request's, OpenAI shape) turns on
  // tool-call parsing and types the arguments; with none, tool-call markup stays content.
  virtual std::unique_ptr<OutputStream> output(const std::string& prompt, const nlohmann::ordered_json& tools) const = 0;
};

// The model's format from tokenizer_config.json (chat_template) in `dir`, or `template_file` when given.
// Null when no template is found.
std::shared_ptr<const ChatFormat> load_chat_format(const std::string& dir, const std::string& template_file);

}  // namespace lily::server
