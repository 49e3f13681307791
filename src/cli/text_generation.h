// Text-level generation for the CLI (`lily chat`): the model's tokenizer and chat template, and a
// generation loop that streams decoded text split into reasoning and content as it arrives.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/generate.h"
#include "text/chat_template.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace lily::cli {

struct TextModel {
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::shared_ptr<text::ChatTemplate> chat_template;

  // Tokenizer from `tokenizer_dir` (default: model_dir); template from there or `template_file`.
  static TextModel load(const std::string& model_dir, const std::string& tokenizer_dir = "",
                        const std::string& template_file = "");
};

struct TextTurn {
  std::string content, reasoning;
  std::vector<text::ToolCall> tool_calls;
  GenerateResult result;
};

// Generates after `prompt` (token ids) on `s`; stop ids default to the tokenizer's when
// `opt.stop_ids` is empty. `on_delta` sees each parsed piece (return false to stop). Reuses the
// session's tokens when they are a prefix of `prompt`, otherwise resets the session.
TextTurn generate_text(Session& s, const text::Tokenizer& tok, const std::vector<int32_t>& prompt,
                       GenerateOptions opt, bool start_in_reasoning,
                       const std::function<bool(const text::ParsedDelta&)>& on_delta);

}  // namespace lily::cli
