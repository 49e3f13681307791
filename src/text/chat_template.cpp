#include "text/chat_template.h"

#include "core/error.h"
#include "core/mapped_file.h"

namespace lily::text {

namespace {
std::string read_text(const std::filesystem::path& p) { return read_text_file(p.string()); }
}  // namespace

ChatTemplate ChatTemplate::from_string(std::string source, std::string name, nlohmann::ordered_json special_tokens) {
  ChatTemplate t;
  t.tpl_ = std::make_shared<jinja::Template>(std::move(source), name);
  t.name_ = std::move(name);
  t.specials_ = special_tokens.is_object() ? std::move(special_tokens) : nlohmann::ordered_json::object();
  return t;
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& dir, const std::filesystem::path& override_file) {
  namespace fs = std::filesystem;
  nlohmann::ordered_json cfg, specials = nlohmann::ordered_json::object();
  fs::path cfg_path = dir / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    try {
      cfg = nlohmann::ordered_json::parse(read_text(cfg_path));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", cfg_path.string(), e.what());
    }
    if (cfg.is_object()) {
      for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
        if (!cfg.contains(k)) continue;
        const auto& v = cfg[k];
        if (v.is_string()) specials[k] = v;
        else if (v.is_object() && v.contains("content") && v["content"].is_string()) specials[k] = v["content"];
      }
    }
  }
  if (!override_file.empty()) {
    if (!fs::exists(override_file)) fail("chat template file {} not found", override_file.string());
    return from_string(read_text(override_file), override_file.string(), specials);
  }
  fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path)) return from_string(read_text(jinja_path), jinja_path.string(), specials);
  if (cfg.is_object() && cfg.contains("chat_template")) {
    const auto& ct = cfg["chat_template"];
    if (ct.is_string()) return from_string(ct.get<std::string>(), cfg_path.string() + " chat_template", specials);
    if (ct.is_array()) {
      for (size_t k = 0; k < ct.size(); ++k) {
        const auto& e = ct[k];
        if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
            e["template"].is_string())
          return from_string(e["template"].get<std::string>(), fmt::format("{} chat_template[{}]", cfg_path.string(), k),
                             specials);
      }
      fail("{}: chat_template list has no entry named \"default\"", cfg_path.string());
    }
    fail("{}: chat_template must be a string or a list of {{name, template}}", cfg_path.string());
  }
  fail("no chat template in {} (looked for chat_template.jinja and tokenizer_config.json chat_template); pass "
       "--chat-template FILE",
       dir.string());
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::ordered_json& kwargs) const {
  if (!messages.is_array()) fail("messages must be a JSON array of {{role, content}} objects");
  for (size_t k = 0; k < messages.size(); ++k)
    if (!messages[k].is_object()) fail("messages[{}] must be an object", k);
  if (!tools.is_null() && !tools.is_array()) fail("tools must be a JSON array");
  if (!kwargs.is_null() && !kwargs.is_object()) fail("template kwargs must be a JSON object");
  nlohmann::ordered_json g = nlohmann::ordered_json::object();
  g["messages"] = messages;
  g["tools"] = tools;
  g["add_generation_prompt"] = add_generation_prompt;
  for (auto it = specials_.begin(); it != specials_.end(); ++it) g[it.key()] = it.value();
  if (kwargs.is_object())
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) g[it.key()] = it.value();
  return tpl_->render(g);
}

bool ChatTemplate::uses_xml_tool_calls() const { return source().find("<function=") != std::string::npos; }

}  // namespace lily::text
