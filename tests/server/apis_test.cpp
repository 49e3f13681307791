// Structured outputs in chat completions over HTTP on the demo model (response_format json_object /
// json_schema, tool_choice required under a tight max_tokens), how a reply with reasoning and tool calls
// (inside the think block too) is split, and the rendering of each API's messages: the Anthropic and
// Responses requests render through the Qwen3 and Qwen3.5-style templates exactly as the equivalent chat
// request does.
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "api_fixture.h"
#include "server/anthropic_messages.h"
#include "server/openai_chat.h"
#include "server/openai_responses.h"
#include "text/chat_template.h"

namespace lily::server::test {
namespace {

// ---- chat completions: response_format and forced tool calls ----

TEST(ChatStructured, ResponseFormatAndRequiredTool) {
  NEED_DEMO();
  int st = 0;
  json msgs = {{{"role", "user"}, {"content", "JSON"}}};
  json a = post_json(demo->port(), "/v1/chat/completions",
                     {{"messages", msgs}, {"max_tokens", 32}, {"response_format", {{"type", "json_object"}}},
                      {"chat_template_kwargs", {{"enable_thinking", false}}}}, &st);
  ASSERT_EQ(st, 200) << a.dump();
  json doc = json::parse(a["choices"][0]["message"]["content"].get<std::string>(), nullptr, false);
  EXPECT_TRUE(doc.is_object()) << a.dump();
  json b = post_json(demo->port(), "/v1/chat/completions",
                     {{"messages", msgs}, {"max_tokens", 40},
                      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", kWeatherSchema}}}}}}, &st);
  ASSERT_EQ(st, 200) << b.dump();
  EXPECT_TRUE(valid_weather(json::parse(b["choices"][0]["message"]["content"].get<std::string>(), nullptr, false))) << b.dump();
  json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", kWeatherSchema}}}}};
  json c = post_json(demo->port(), "/v1/chat/completions",
                     {{"messages", msgs}, {"max_tokens", 128}, {"tools", tools}, {"tool_choice", "required"}, {"parallel_tool_calls", false}}, &st);
  ASSERT_EQ(st, 200) << c.dump();
  EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls") << c.dump();
  auto& calls = c["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << c.dump();
  EXPECT_TRUE(valid_weather(json::parse(calls[0]["function"]["arguments"].get<std::string>(), nullptr, false))) << c.dump();
  json bad_schema = post_json(demo->port(), "/v1/chat/completions",
                              {{"messages", msgs}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"enum", json::array()}}}}}}}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(bad_schema["error"]["param"], "response_format.json_schema.schema") << bad_schema.dump();
}

// A reply with a tool call written inside its think block, reasoning after it, text and a second call:
// two tool_calls, the reasoning in reasoning_content, only the text in content (streamed and not);
// parallel_tool_calls false ends the reply after the first call.
TEST(ChatStructured, ToolCallsInsideThinkingAreToolCalls) {
  NEED_SCRIPTED();
  sd->script(kThinkAndCallsScript);
  json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", kWeatherSchema}}}}};
  json body = {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"max_tokens", 200}, {"tools", tools}};
  int st = 0;
  json r = post_json(sd->port(), "/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  const json& m = r["choices"][0]["message"];
  EXPECT_EQ(m["content"], kScriptText) << r.dump();
  const std::string reasoning = m["reasoning_content"];
  EXPECT_NE(reasoning.find(kScriptReasoning[0]), std::string::npos) << reasoning;
  EXPECT_NE(reasoning.find(kScriptReasoning[1]), std::string::npos) << reasoning;
  EXPECT_EQ(reasoning.find("<tool_call>"), std::string::npos) << reasoning;
  ASSERT_EQ(m["tool_calls"].size(), 2u) << r.dump();
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(json::parse(m["tool_calls"][i]["function"]["arguments"].get<std::string>()), kScriptCalls[i]);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");

  json sb = body;
  sb["stream"] = true;
  auto s = post_sse(sd->port(), "/v1/chat/completions", sb);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(joined(s, "content"), kScriptText);
  EXPECT_EQ(joined(s, "reasoning_content"), reasoning);
  int calls = 0;
  for (auto& e : s.events)
    if (e.contains("choices") && !e["choices"].empty() && e["choices"][0]["delta"].contains("tool_calls")) calls += int(e["choices"][0]["delta"]["tool_calls"].size());
  EXPECT_EQ(calls, 2);

  body["parallel_tool_calls"] = false;
  json one = post_json(sd->port(), "/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200) << one.dump();
  ASSERT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u) << one.dump();
  EXPECT_EQ(one["choices"][0]["finish_reason"], "tool_calls");

  // A call right after <think>, the block never closed: a call, no reasoning, no content.
  sd->script("<think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\", \"days\": 4}}\n</tool_call>");
  json open = post_json(sd->port(), "/v1/chat/completions", body, &st);
  ASSERT_EQ(st, 200) << open.dump();
  const json& om = open["choices"][0]["message"];
  ASSERT_EQ(om["tool_calls"].size(), 1u) << open.dump();
  EXPECT_EQ(json::parse(om["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"], "Lima");
  EXPECT_TRUE(om["content"].is_null() || om["content"] == "") << open.dump();
  EXPECT_TRUE(!om.contains("reasoning_content") || om["reasoning_content"].is_null() || om["reasoning_content"] == "") << open.dump();
  sd->script("");
}

// A server started with speculative decoding uses it for the agent APIs too (prompt lookup on a reply
// that repeats itself): the same reply, rounds counted, drafts accepted; under a forced call as well.
TEST(ApiSpeculation, ServerDefaultServesMessagesAndResponses) {
  ServerOptions so;
  so.model_id = "lily-scripted-spec";
  so.spec.mode = SpecMode::Ngram;
  so.spec.depth = 4;
  auto sd = start_scripted(so);
  if (!sd) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  const std::string text = "alpha beta gamma delta epsilon. alpha beta gamma delta epsilon. alpha beta gamma delta epsilon.";
  sd->script(text);
  // The scheduler counts a request once it is reaped, just after its reply went out.
  auto settled = [&](const char* name) {
    for (int i = 0; i < 50 && metric(sd->port(), "lily_requests_active") > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return metric(sd->port(), name);
  };
  auto rounds = [&] { return settled("lily_spec_rounds_total"); };
  auto accepted = [&] { return settled("lily_spec_accepted_tokens_total"); };
  double r0 = rounds(), a0 = accepted();
  int st = 0;
  json m = post_json(sd->port(), "/v1/messages", {{"model", "m"}, {"max_tokens", 64}, {"messages", {{{"role", "user"}, {"content", "Go."}}}}}, &st);
  ASSERT_EQ(st, 200) << m.dump();
  EXPECT_EQ(m["content"][0]["text"], text);
  EXPECT_GT(rounds(), r0);
  EXPECT_GT(accepted(), a0);
  r0 = rounds();
  a0 = accepted();
  json r = post_json(sd->port(), "/v1/responses", {{"input", "Go."}, {"max_output_tokens", 64}, {"reasoning", {{"effort", "none"}}}}, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["output"].back()["content"][0]["text"], text);
  EXPECT_GT(rounds(), r0);
  EXPECT_GT(accepted(), a0);
  // A forced call whose arguments repeat: drafted, checked against the grammar, still one valid call.
  sd->script("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"abcabcabcabcabc\", \"days\": 12121212}}\n</tool_call>");
  r0 = rounds();
  json t = post_json(sd->port(), "/v1/messages",
                     {{"model", "m"}, {"max_tokens", 80}, {"messages", {{{"role", "user"}, {"content", "Go."}}}},
                      {"tools", {{{"name", "get_weather"}, {"input_schema", kWeatherSchema}}}},
                      {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}, {"disable_parallel_tool_use", true}}}}, &st);
  ASSERT_EQ(st, 200) << t.dump();
  ASSERT_EQ(t["content"].size(), 1u) << t.dump();
  EXPECT_TRUE(valid_weather(t["content"][0]["input"])) << t.dump();
  EXPECT_GT(rounds(), r0);
}

// ---- rendering: each API's messages render like the equivalent chat request ----

TEST(ApiRendering, MessagesAndResponsesRenderLikeChat) {
  const std::string dir = tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "Qwen3 tokenizer not fetched";
  const json params = {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}};
  // The same two-turn tool conversation with thinking, in the three APIs.
  json chat = {{"messages",
                {{{"role", "system"}, {"content", "Be brief."}},
                 {{"role", "user"}, {"content", "Weather in Paris?"}},
                 {{"role", "assistant"}, {"content", "Checking."}, {"reasoning_content", "I should call the tool."},
                  {"tool_calls", {{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
                 {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}}}},
               {"tools", {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"description", "Weather"}, {"parameters", params}}}}}},
               {"chat_template_kwargs", {{"enable_thinking", true}}}};
  json anthropic = {{"model", "m"}, {"max_tokens", 8}, {"system", {{{"type", "text"}, {"text", "Be brief."}}}},
                    {"thinking", {{"type", "enabled"}, {"budget_tokens", 100}}},
                    {"tools", {{{"name", "get_weather"}, {"description", "Weather"}, {"input_schema", params}}}},
                    {"messages",
                     {{{"role", "user"}, {"content", "Weather in Paris?"}},
                      {{"role", "assistant"}, {"content", {{{"type", "thinking"}, {"thinking", "I should call the tool."}, {"signature", ""}},
                                                            {{"type", "text"}, {"text", "Checking."}},
                                                            {{"type", "tool_use"}, {"id", "call_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}}}},
                      {{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", "call_1"}, {"content", {{{"type", "text"}, {"text", "18 C"}}}}}}}}}}};
  json responses = {{"instructions", "Be brief."}, {"reasoning", {{"effort", "high"}}},
                    {"tools", {{{"type", "function"}, {"name", "get_weather"}, {"description", "Weather"}, {"parameters", params}}}},
                    {"input",
                     {{{"role", "user"}, {"content", "Weather in Paris?"}},
                      {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", json::array()}, {"content", {{{"type", "reasoning_text"}, {"text", "I should call the tool."}}}}},
                      {{"type", "message"}, {"role", "assistant"}, {"content", {{{"type", "output_text"}, {"text", "Checking."}}}}},
                      {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}},
                      {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "18 C"}}}}};
  RequestLimits limits;
  ChatRequest cr = parse_chat_request(chat, limits);
  MessagesRequest mr = parse_messages_request(anthropic, limits, false);
  ResponsesRequest rr = parse_responses_request(responses, limits);
  json rr_messages = json::array({{{"role", "system"}, {"content", rr.instructions}}});
  for (auto& m : rr.input) rr_messages.push_back(m);
  for (const std::string& tpl : {std::string(), std::string(LILY_TEST_DATA) + "/text/qwen3.5-style.jinja"}) {
    auto t = text::ChatTemplate::load(dir, tpl);
    const std::string want = t.render(cr.messages, cr.tools, true, cr.kwargs);
    EXPECT_EQ(t.render(mr.messages, mr.tools, true, mr.kwargs), want) << (tpl.empty() ? "qwen3" : tpl);
    EXPECT_EQ(t.render(rr_messages, rr.tools, true, rr.kwargs), want) << (tpl.empty() ? "qwen3" : tpl);
    EXPECT_NE(want.find("I should call the tool."), std::string::npos);  // the thinking block is fed back
  }
}

}  // namespace
}  // namespace lily::server::test
