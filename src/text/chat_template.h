// A model's chat template: found in the model directory, rendered like transformers'
// apply_chat_template(messages, tools=..., add_generation_prompt=..., **kwargs).
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace lily::text {

class ChatTemplate {
 public:
  // Template source, first found: `override_file` (when not empty), DIR/chat_template.jinja,
  // DIR/tokenizer_config.json "chat_template" (a string, or a list of {name, template} where "default"
  // is used). bos/eos/pad/unk token strings come from tokenizer_config.json. Missing template or
  // syntax error -> InputError naming the file, line and column.
  static ChatTemplate load(const std::filesystem::path& dir, const std::filesystem::path& override_file = {});
  // `special_tokens`: object such as {"eos_token": "<|im_end|>"} passed to the template as variables.
  static ChatTemplate from_string(std::string source, std::string name,
                                  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());

  // `messages`: array of {role, content, ...}; `tools`: array of tool schemas or null (no tools);
  // `kwargs`: extra variables such as {"enable_thinking": false}, overriding the special tokens.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return tpl_->source(); }
  const std::string& name() const { return name_; }
  // The template writes tool calls as <function=NAME><parameter=...> (Qwen3.5 / Qwen3-Coder) rather
  // than <tool_call>{json}</tool_call>.
  bool uses_xml_tool_calls() const;

 private:
  std::shared_ptr<jinja::Template> tpl_;
  std::string name_;
  nlohmann::ordered_json specials_;
};

}  // namespace lily::text
