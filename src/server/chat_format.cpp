#include "server/chat_format.h"

#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "text/chat_template.h"
#include "text/output_parser.h"

namespace lily::server {

void OutputDelta::append(OutputDelta&& d) {
  content += d.content;
  reasoning += d.reasoning;
  for (auto& t : d.tool_calls) tool_calls.push_back(std::move(t));
}

namespace {

// The text layer's incremental parser, in the server's delta shape. Each finished call gets an id.
class ParserOutput : public OutputStream {
 public:
  explicit ParserOutput(text::OutputParserOptions o) : p_(std::move(o)) {}
  OutputDelta push(std::string_view text) override { return convert(p_.feed(text)); }
  OutputDelta finish() override { return convert(p_.finish()); }
  bool in_reasoning() const override { return p_.in_reasoning(); }
  int tool_calls() const override { return calls_; }

 private:
  OutputDelta convert(text::ParsedDelta&& d) {
    OutputDelta o;
    o.content = std::move(d.content);
    o.reasoning = std::move(d.reasoning);
    for (auto& tc : d.tool_calls) {
      ToolCallDelta t;
      t.index = calls_++;
      t.id = fmt::format("call_{:016x}", rng_());
      t.name = tc.name;
      t.arguments = tc.arguments.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      t.first = true;
      o.tool_calls.push_back(std::move(t));
    }
    return o;
  }
  text::OutputParser p_;
  int calls_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};
};

class TemplateFormat : public ChatFormat {
 public:
  explicit TemplateFormat(text::ChatTemplate t) : tpl_(std::move(t)) {}

  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     const nlohmann::ordered_json& kwargs, bool add_generation_prompt) const override {
    try {
      return tpl_.render(messages, tools.empty() ? nlohmann::ordered_json() : tools, add_generation_prompt, kwargs);
    } catch (const InputError& e) {
      // Errors name the template by its file; a client is told only the line and column.
      std::string m = e.what();
      const std::string& name = tpl_.name();
      for (size_t at; !name.empty() && (at = m.find(name)) != std::string::npos;) m.replace(at, name.size(), "template");
      throw InputError(m);
    }
  }

  std::unique_ptr<OutputStream> output(const std::string& prompt, const nlohmann::ordered_json& tools) const override {
    text::OutputParserOptions o;
    o.parse_reasoning = true;
    o.start_in_reasoning = text::prompt_opens_thinking(prompt);
    o.parse_tool_calls = tools.is_array() && !tools.empty();
    o.tools = o.parse_tool_calls ? tools : nlohmann::ordered_json();
    return std::make_unique<ParserOutput>(std::move(o));
  }

 private:
  text::ChatTemplate tpl_;
};

}  // namespace

std::shared_ptr<const ChatFormat> load_chat_format(const std::string& dir, const std::string& template_file) {
  namespace fs = std::filesystem;
  if (template_file.empty()) {
    std::error_code ec;
    bool has = fs::exists(fs::path(dir) / "chat_template.jinja", ec) || fs::exists(fs::path(dir) / "tokenizer_config.json", ec);
    if (!has) return nullptr;
    try {
      return std::make_shared<TemplateFormat>(text::ChatTemplate::load(dir));
    } catch (const InputError&) {
      return nullptr;  // a tokenizer_config.json without a template: no chat
    }
  }
  return std::make_shared<TemplateFormat>(text::ChatTemplate::load(dir, template_file));
}

}  // namespace lily::server
