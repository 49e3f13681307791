#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "core/error.h"
#include "text/chat_template.h"

namespace lily::cli {
namespace {

nlohmann::ordered_json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open {}", what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {} is not valid JSON: {}", what, path, e.what());
  }
}

Register reg_render("render", "Print the prompt a chat template makes from messages (exactly, no trailing newline)",
             [](CLI::App& app) {
  struct Opts {
    std::string tokenizer, messages, tools, kwargs, chat_template;
    bool gen = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--tokenizer,--model", o->tokenizer, "Directory with tokenizer_config.json / chat_template.jinja")->required();
  app.add_option("--messages-file", o->messages, "JSON array of {role, content} messages (or {\"messages\": [...]})")->required();
  app.add_option("--tools-file", o->tools, "JSON array of tool schemas");
  app.add_flag("--add-generation-prompt", o->gen, "End with the assistant turn opening");
  app.add_option("--template-kwargs", o->kwargs, "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
  app.add_option("--chat-template", o->chat_template, "Jinja file to use instead of the model's template");
  return [o]() -> int {
    auto msgs = read_json_file(o->messages, "--messages-file");
    nlohmann::ordered_json tools = nullptr, kwargs = nlohmann::ordered_json::object();
    if (msgs.is_object() && msgs.contains("messages")) {
      if (msgs.contains("tools") && o->tools.empty()) tools = msgs["tools"];
      msgs = nlohmann::ordered_json(msgs["messages"]);
    }
    if (!o->tools.empty()) tools = read_json_file(o->tools, "--tools-file");
    if (!o->kwargs.empty()) {
      try {
        kwargs = nlohmann::ordered_json::parse(o->kwargs);
      } catch (const nlohmann::json::exception& e) {
        fail("--template-kwargs: not valid JSON: {}", e.what());
      }
      if (!kwargs.is_object()) fail("--template-kwargs must be a JSON object");
    }
    auto tpl = text::ChatTemplate::load(o->tokenizer, o->chat_template);
    std::string out = tpl.render(msgs, tools, o->gen, kwargs);
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
