// Shared by the API tests (Anthropic Messages, OpenAI Responses, chat completions' structured outputs):
// named SSE events, a tool schema, and two more demo servers beside the shared one: one whose replies
// follow a script (the scripted CPU backend: think blocks and tool calls from a random model, to check
// how each API reports them), one with the Qwen3.5-style template (the prompt opens <think>; tool calls
// in the XML form).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "../support/scripted_backend.h"
#include "server_fixture.h"

namespace lily::server::test {

// Anthropic / Responses SSE: (event name, data) pairs.
inline std::vector<std::pair<std::string, json>> named_events(const std::string& raw) {
  std::vector<std::pair<std::string, json>> out;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t end = raw.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string ev = raw.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("event: ", 0) != 0) continue;
    size_t nl = ev.find('\n');
    std::string name = ev.substr(7, nl - 7);
    std::string data = ev.substr(nl + 1);
    if (data.rfind("data: ", 0) != 0) continue;
    out.emplace_back(name, json::parse(data.substr(6), nullptr, false));
  }
  return out;
}

inline const json kWeatherSchema = json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
    "days": {"type": "integer"}}, "required": ["city", "days"], "additionalProperties": false})");

inline bool valid_weather(const json& a) {
  return a.is_object() && a.size() == 2 && a.contains("city") && a["city"].is_string() && a.contains("days") &&
         a["days"].is_number_integer();
}

// A reply with reasoning, a tool call written inside the think block, reasoning after it, text and a
// second call (Qwen3's JSON form), and the calls it holds.
inline const std::string kThinkAndCallsScript =
    "<think>\nThe user wants weather. Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\nThen I answer.\n</think>\n\nIt is sunny.\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 1}}\n</tool_call>";
inline const char* const kScriptReasoning[] = {"The user wants weather. Let me check.", "Then I answer."};
inline const char* const kScriptText = "It is sunny.";
inline const json kScriptCalls = json::parse(R"([{"city": "Paris", "days": 2}, {"city": "Oslo", "days": 1}])");

// The narrow demo model with the real Qwen3 tokenizer, its replies following a script; the prompt cache
// off (the script follows the tokens the steps carry).
struct ScriptedDemo {
  std::unique_ptr<Running> run;
  test_support::ScriptedCpuBackend* backend = nullptr;
  int port() const { return run->port(); }
  void script(const std::string& text) const { backend->set_script(run->tok->encode(text)); }
};

// The demo architecture, narrower (the 151K-row head dominates a step), for the tokenizer's vocabulary.
inline std::shared_ptr<const ModelWeights> narrow_demo(const text::Tokenizer& tok) {
  DemoModelOptions d;
  d.vocab = tok.vocab_size();
  d.hidden = 64;
  return make_demo_weights(d);
}

// `so`: model id, slots, speculation; the prompt cache is off.
inline std::unique_ptr<ScriptedDemo> start_scripted(ServerOptions so) {
  const std::string dir = tokenizer_dir();
  if (dir.empty()) return nullptr;
  std::shared_ptr<const text::Tokenizer> tok = text::Tokenizer::load(dir);
  std::shared_ptr<const ModelWeights> w = narrow_demo(*tok);
  auto be = std::make_unique<test_support::ScriptedCpuBackend>(w, *tok->token_id("<|im_end|>"));
  auto out = std::make_unique<ScriptedDemo>();
  out->backend = be.get();
  so.sched.cache_bytes = 0;
  const int64_t ctx = 2048;
  out->run = start_server_on(Engine::from_backend(w, std::move(be), EngineOptions{"cpu", ctx, 256}), tok, dir, so, ctx);
  return out;
}

inline ScriptedDemo* scripted_demo() {
  static std::unique_ptr<ScriptedDemo> s = [] {
    ServerOptions so;
    so.model_id = "lily-scripted";
    so.sched.parallel = 1;
    return start_scripted(so);
  }();
  return s.get();
}

#define NEED_SCRIPTED()                                                                     \
  auto* sd = scripted_demo();                                                               \
  if (!sd) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";

// The demo model with the Qwen3.5-style template (tests/data/text): with thinking on, the prompt ends
// inside an open <think>.
inline Running* qwen35_demo() {
  static std::unique_ptr<Running> r = []() -> std::unique_ptr<Running> {
    const std::string dir = tokenizer_dir();
    if (dir.empty()) return nullptr;
    std::shared_ptr<const text::Tokenizer> tok = text::Tokenizer::load(dir);
    ServerOptions so;
    so.model_id = "lily-demo-35";
    so.sched.parallel = 2;
    const int64_t ctx = 2048;
    return start_server_on(Engine::from_weights(narrow_demo(*tok), EngineOptions{"cpu", ctx, 256}), tok, dir, so, ctx,
                           std::string(LILY_TEST_DATA) + "/text/qwen3.5-style.jinja");
  }();
  return r.get();
}

}  // namespace lily::server::test
