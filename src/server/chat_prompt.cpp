#include "server/chat_prompt.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "text/output_parser.h"

namespace lily::server {

ChatPrompt render_chat_prompt(const Core& core, const json& messages, const json& tools, const json& kwargs, const char* param) {
  ChatPrompt p;
  try {
    p.text = core.chat->render(messages, tools, kwargs, true);
  } catch (const InputError& e) {
    bad(param, fmt::format("the chat template failed: {}", e.what()), "template_error");
  }
  p.ids = core.tok->encode(p.text, true);
  core.check_prompt_ids(p.ids, param);
  // Also save the state where the last message starts (a regenerated or edited last turn reuses it)
  // and where it ends, before the generation prompt: the next turn renders this one's reply after it
  // (the Qwen templates render a reply differently once a later user turn follows, so the state after
  // the reply is no prefix of the next prompt), and continues from there. A cut counts when the text
  // before it starts the prompt's and the rest encodes to the prompt's last tokens.
  auto cut = [&](const json& msgs) {
    try {
      const std::string before = core.chat->render(msgs, tools, kwargs, false);
      if (before.empty() || before.size() >= p.text.size() || p.text.compare(0, before.size(), before) != 0) return;
      const auto rest = core.tok->encode(std::string_view(p.text).substr(before.size()), true);
      if (rest.empty() || rest.size() >= p.ids.size() || !std::equal(rest.rbegin(), rest.rend(), p.ids.rbegin())) return;
      p.boundaries.push_back(p.ids.size() - rest.size());
    } catch (const std::exception&) {
      // Some templates refuse a conversation that ends early; then there is no snapshot there.
    }
  };
  if (messages.size() >= 2) cut(json(messages.begin(), messages.end() - 1));
  cut(messages);
  std::sort(p.boundaries.begin(), p.boundaries.end());
  p.boundaries.erase(std::unique(p.boundaries.begin(), p.boundaries.end()), p.boundaries.end());
  return p;
}

bool thinking_enabled(const json& kwargs) {
  auto it = kwargs.find("enable_thinking");
  return it == kwargs.end() || !it->is_boolean() || it->get<bool>();
}

std::shared_ptr<TokenConstraint> output_constraint(Structured* sp, const OutputConstraint& c, const json& tools,
                                                   const std::string& prompt, bool thinking, int64_t max_tokens) {
  if (c.kind == OutputConstraint::None && !c.thinking_budget) return nullptr;
  LILY_ASSERT(sp);
  Structured& s = *sp;
  const text::ReasoningMode mode = text::reasoning_mode(prompt, thinking);
  std::shared_ptr<TokenConstraint> out;
  try {
    switch (c.kind) {
      case OutputConstraint::None: break;
      case OutputConstraint::JsonObject: out = s.json_output(nullptr, c.where, mode, max_tokens); break;
      case OutputConstraint::JsonSchema: out = s.json_output(c.schema, c.where, mode, max_tokens); break;
      case OutputConstraint::ToolCall: out = s.tool_calls(tools, c.only, c.max_calls, mode, max_tokens, c.tool_schema_where); break;
    }
  } catch (const FieldError&) {
    throw;
  } catch (const InputError& e) {
    bad(c.where, e.what(), "invalid_schema");
  }
  if (c.thinking_budget && mode != text::ReasoningMode::None)
    out = s.thinking_budget(std::move(out), *c.thinking_budget, mode == text::ReasoningMode::Open);
  return out;
}

}  // namespace lily::server
