#include "server/chat_format.h"

#include <filesystem>

#include "core/error.h"
#include "text/chat_template.h"

namespace lily::server {

namespace {

// Interim splitter: everything is content.
class PlainOutput : public OutputStream {
 public:
  OutputDelta push(std::string_view text) override {
    OutputDelta d;
    d.content = std::string(text);
    return d;
  }
  OutputDelta finish() override { return {}; }
  bool in_reasoning() const override { return false; }
  int tool_calls() const override { return 0; }
};

class TemplateFormat : public ChatFormat {
 public:
  explicit TemplateFormat(text::ChatTemplate t) : tpl_(std::move(t)) {}

  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     const nlohmann::ordered_json& kwargs, bool add_generation_prompt) const override {
    return tpl_.render(messages, tools.empty() ? nlohmann::ordered_json() : tools, add_generation_prompt, kwargs);
  }

  std::unique_ptr<OutputStream> output(const std::string& prompt, bool parse_tools) const override {
    return std::make_unique<PlainOutput>();
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
