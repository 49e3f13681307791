// The chat format the server uses: the real Qwen3 template renders tools and history, and generated
// text streamed token by token splits into reasoning, content and tool calls with JSON arguments.
#include <gtest/gtest.h>

#include "runtime/demo_model.h"
#include "server/chat_format.h"
#include "server/stop_filter.h"
#include "text/tokenizer.h"

namespace lily::server {
namespace {

using ojson = nlohmann::ordered_json;

struct Fmt {
  std::shared_ptr<const text::Tokenizer> tok;
  std::shared_ptr<const ChatFormat> chat;
};

const Fmt& load() {
  static const Fmt f = []() -> Fmt {
    std::string dir = find_demo_tokenizer_dir();
    if (dir.empty()) return {};
    return {text::Tokenizer::load(dir), load_chat_format(dir, "")};
  }();
  return f;
}

ojson weather_tools() {
  return ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}])");
}

// Feeds `generated` token by token (as the server does: bytes through the stop filter, then the
// splitter) and collects everything.
OutputDelta stream(const Fmt& f, const std::string& prompt, const ojson& tools, const std::string& generated) {
  auto out = f.chat->output(prompt, tools);
  StopFilter stop({});
  OutputDelta all;
  for (int32_t id : f.tok->encode(generated, true)) {
    std::string t = stop.push(f.tok->token_bytes(id));
    if (!t.empty()) all.append(out->push(t));
  }
  all.append(out->push(stop.finish()));
  all.append(out->finish());
  return all;
}

TEST(ChatFormat, RendersToolsAndHistory) {
  const auto& f = load();
  if (!f.chat) GTEST_SKIP() << "Qwen3 tokenizer not fetched";
  ojson msgs = ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp_c\": 21}"}])");
  std::string p = f.chat->render(msgs, weather_tools(), ojson{{"enable_thinking", false}}, true);
  EXPECT_NE(p.find("<tools>"), std::string::npos) << p;
  EXPECT_NE(p.find("\"name\": \"get_weather\""), std::string::npos) << p;
  EXPECT_NE(p.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"), std::string::npos) << p;
  EXPECT_NE(p.find("<tool_response>\n{\"temp_c\": 21}\n</tool_response>"), std::string::npos) << p;
  EXPECT_TRUE(p.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << p;
}

TEST(ChatFormat, SplitsReasoningContentAndToolCallsTokenByToken) {
  const auto& f = load();
  if (!f.chat) GTEST_SKIP() << "Qwen3 tokenizer not fetched";
  ojson msgs = ojson::parse(R"([{"role": "user", "content": "Weather in Paris for 3 days?"}])");
  std::string prompt = f.chat->render(msgs, weather_tools(), ojson::object(), true);
  const std::string gen =
      "<think>\nThe user wants weather. I should call the tool.\n</think>\n\nLet me check.\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": \"3\"}}\n</tool_call>";
  OutputDelta d = stream(f, prompt, weather_tools(), gen);
  EXPECT_EQ(d.reasoning, "The user wants weather. I should call the tool.");
  EXPECT_EQ(d.content, "Let me check.");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  const auto& tc = d.tool_calls[0];
  EXPECT_TRUE(tc.first);
  EXPECT_EQ(tc.index, 0);
  EXPECT_EQ(tc.name, "get_weather");
  EXPECT_TRUE(tc.id.rfind("call_", 0) == 0) << tc.id;
  // Arguments are one JSON object, typed by the schema ("3" -> 3).
  auto args = ojson::parse(tc.arguments);
  EXPECT_EQ(args, ojson::parse(R"({"city": "Paris", "days": 3})"));
  for (const char* tag : {"<think>", "</think>", "<tool_call>", "</tool_call>"}) {
    EXPECT_EQ(d.content.find(tag), std::string::npos) << tag;
    EXPECT_EQ(d.reasoning.find(tag), std::string::npos) << tag;
  }
}

TEST(ChatFormat, WithoutToolsMarkupStaysContent) {
  const auto& f = load();
  if (!f.chat) GTEST_SKIP() << "Qwen3 tokenizer not fetched";
  std::string prompt = f.chat->render(ojson::parse(R"([{"role": "user", "content": "hi"}])"), ojson::array(), ojson::object(), true);
  OutputDelta d = stream(f, prompt, ojson::array(), "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>");
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_NE(d.content.find("<tool_call>"), std::string::npos);
}

}  // namespace
}  // namespace lily::server
