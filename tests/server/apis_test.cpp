// The Anthropic Messages and OpenAI Responses APIs and structured outputs over HTTP on the demo model:
// reply shapes, the streamed event sequences, forced tool calls and JSON that parse against their
// schemas, count_tokens, previous_response_id, and every malformed field answered in the API's own
// envelope with a 4xx naming it. Also: each API's messages render like the equivalent chat request.
#include <cctype>

#include <fmt/format.h>

#include "server/anthropic_messages.h"
#include "server/openai_chat.h"
#include "server/openai_responses.h"
#include "server_fixture.h"
#include "text/chat_template.h"

namespace lily::server::test {
namespace {

// Anthropic SSE: (event name, data) pairs.
std::vector<std::pair<std::string, json>> named_events(const std::string& raw) {
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

SseResult post_stream(int port, const std::string& path, const json& body) { return post_sse(port, path, body); }

const json kWeatherSchema = json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
    "days": {"type": "integer"}}, "required": ["city", "days"], "additionalProperties": false})");

bool valid_weather(const json& a) {
  return a.is_object() && a.size() == 2 && a.contains("city") && a["city"].is_string() && a.contains("days") &&
         a["days"].is_number_integer();
}

// ---- Anthropic ----

TEST(AnthropicApi, MessageShapeAndUsage) {
  NEED_DEMO();
  int st = 0;
  json r = post_json(demo->port(), "/v1/messages",
                     {{"model", "claude-anything"}, {"max_tokens", 6}, {"system", "Be brief."},
                      {"messages", {{{"role", "user"}, {"content", "Hello"}}}}}, &st, {{"anthropic-version", "2023-06-01"}});
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["type"], "message");
  EXPECT_EQ(r["model"], "lily-demo");
  EXPECT_EQ(r["content"][0]["type"], "text");
  EXPECT_TRUE(r["stop_reason"] == "max_tokens" || r["stop_reason"] == "end_turn");
  EXPECT_GT(r["usage"]["input_tokens"].get<int>() + r["usage"]["cache_read_input_tokens"].get<int>(), 0);
  EXPECT_GT(r["usage"]["output_tokens"].get<int>(), 0);
  json c = post_json(demo->port(), "/v1/messages/count_tokens",
                     {{"model", "x"}, {"system", "Be brief."}, {"messages", {{{"role", "user"}, {"content", "Hello"}}}}}, &st);
  ASSERT_EQ(st, 200) << c.dump();
  EXPECT_EQ(c["input_tokens"], r["usage"]["input_tokens"].get<int>() + r["usage"]["cache_read_input_tokens"].get<int>());
}

TEST(AnthropicApi, StreamEventSequenceAndForcedToolUse) {
  NEED_DEMO();
  json body = {{"model", "m"}, {"max_tokens", 128}, {"stream", true},
               {"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
               {"tools", {{{"name", "get_weather"}, {"description", "d"}, {"input_schema", kWeatherSchema}}}},
               {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
               {"thinking", {{"type", "enabled"}, {"budget_tokens", 8}}}};
  auto s = post_stream(demo->port(), "/v1/messages", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  auto ev = named_events(s.raw);
  ASSERT_GE(ev.size(), 4u) << s.raw;
  EXPECT_EQ(ev.front().first, "message_start");
  EXPECT_EQ(ev.back().first, "message_stop");
  int open = -1;
  std::string json_in;
  bool tool = false;
  for (auto& [name, d] : ev) {
    EXPECT_EQ(d["type"], name);  // the event line and the data agree
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block started inside another";
      open = d["index"];
      tool = d["content_block"]["type"] == "tool_use";
      if (tool) {
        EXPECT_EQ(d["content_block"]["name"], "get_weather");
      }
    } else if (name == "content_block_delta") {
      EXPECT_EQ(d["index"], open);
      if (tool) {
        json_in += d["delta"]["partial_json"].get<std::string>();
      } else {
        EXPECT_TRUE(d["delta"]["type"] == "thinking_delta" || d["delta"]["type"] == "text_delta") << d.dump();
      }
    } else if (name == "content_block_stop") {
      EXPECT_EQ(d["index"], open);
      open = -1;
    } else if (name == "message_delta") {
      EXPECT_EQ(d["delta"]["stop_reason"], "tool_use");
      EXPECT_GT(d["usage"]["output_tokens"].get<int>(), 0);
    }
  }
  EXPECT_TRUE(valid_weather(json::parse(json_in, nullptr, false))) << json_in;
}

// max_tokens far below the shortest call's bytes still leaves a complete call: the mask counts the
// fewest tokens that can finish it (the Qwen3 tokenizer's multi-byte tokens), not bytes.
TEST(AnthropicApi, ForcedToolUseFitsATightMaxTokens) {
  NEED_DEMO();
  for (int i = 0; i < 4; ++i) {
    int st = 0;
    json r = post_json(demo->port(), "/v1/messages",
                       {{"model", "m"}, {"max_tokens", 24}, {"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
                        {"tools", {{{"name", "get_weather"}, {"input_schema", kWeatherSchema}}}},
                        {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}, {"disable_parallel_tool_use", true}}}},
                       &st);
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(r["stop_reason"], "tool_use") << r.dump();
    ASSERT_EQ(r["content"].size(), 1u) << r.dump();
    EXPECT_TRUE(valid_weather(r["content"][0]["input"])) << r.dump();
    EXPECT_LE(r["usage"]["output_tokens"].get<int>(), 24);
  }
  // The shortest such call is 20 tokens; with the end id, 21 end the reply as a tool call.
  json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", kWeatherSchema}}}}};
  for (int i = 0; i < 4; ++i) {
    int st = 0;
    json c = post_json(demo->port(), "/v1/chat/completions",
                       {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"max_tokens", 21}, {"tools", tools},
                        {"tool_choice", "required"}, {"parallel_tool_calls", false},
                        {"chat_template_kwargs", {{"enable_thinking", false}}}}, &st);
    ASSERT_EQ(st, 200) << c.dump();
    EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls") << c.dump();
    ASSERT_EQ(c["choices"][0]["message"]["tool_calls"].size(), 1u) << c.dump();
  }
  int st = 0;
  json b = post_json(demo->port(), "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "JSON"}}}}, {"max_tokens", 12},
                      {"chat_template_kwargs", {{"enable_thinking", false}}},
                      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", kWeatherSchema}}}}}}, &st);
  ASSERT_EQ(st, 200) << b.dump();
  EXPECT_TRUE(valid_weather(json::parse(b["choices"][0]["message"]["content"].get<std::string>(), nullptr, false))) << b.dump();
}

TEST(AnthropicApi, StopSequenceIsReported) {
  NEED_DEMO();
  // Generate once, then stop on a piece of that text.
  json base = {{"model", "m"}, {"max_tokens", 24}, {"temperature", 0}, {"messages", {{{"role", "user"}, {"content", "Go"}}}}};
  json r = post_json(demo->port(), "/v1/messages", base);
  std::string text = r["content"][0]["text"];
  size_t at = text.size() / 2;
  while (at < text.size() && !std::isalnum(static_cast<unsigned char>(text[at]))) ++at;  // an ASCII character
  if (at >= text.size()) GTEST_SKIP() << "no ASCII letter in the second half to stop on: " << text;
  std::string stop = text.substr(at, 1);
  base["stop_sequences"] = {stop};
  json s = post_json(demo->port(), "/v1/messages", base);
  EXPECT_EQ(s["stop_reason"], "stop_sequence") << s.dump();
  EXPECT_EQ(s["stop_sequence"], stop);
}

TEST(AnthropicApi, MalformedFieldsGetTheEnvelope) {
  NEED_DEMO();
  json ok = {{"model", "m"}, {"max_tokens", 4}, {"messages", {{{"role", "user"}, {"content", "x"}}}}};
  auto with = [&](const char* k, json v) {
    json b = ok;
    if (v.is_null()) b.erase(k);
    else b[k] = v;
    return b;
  };
  struct Case {
    json body;
    std::string names;
  };
  std::vector<Case> cases = {
      {with("max_tokens", nullptr), "max_tokens"},
      {with("max_tokens", 0), "max_tokens"},
      {with("model", nullptr), "model"},
      {with("messages", json::array()), "messages"},
      {with("messages", {{{"role", "system"}, {"content", "x"}}}), "messages.0.role"},
      {with("messages", {{{"role", "user"}}}), "messages.0.content"},
      {with("messages", {{{"role", "user"}, {"content", {{{"type", "image"}}}}}}), "messages.0.content.0.type"},
      {with("messages", {{{"role", "user"}, {"content", {{{"type", "tool_result"}}}}}}), "tool_use_id"},
      {with("messages", {{{"role", "assistant"}, {"content", {{{"type", "tool_use"}, {"id", "a"}, {"name", "f"}, {"input", 3}}}}}}), "input"},
      {with("temperature", 1.5), "temperature"},
      {with("top_k", -1), "top_k"},
      {with("stop_sequences", "x"), "stop_sequences"},
      {with("system", 5), "system"},
      {with("thinking", {{"type", "sometimes"}}), "thinking.type"},
      {with("thinking", {{"type", "enabled"}}), "thinking.budget_tokens"},
      {with("tools", {{{"name", "f"}}}), "input_schema"},
      {with("tools", {{{"type", "web_search_20250305"}, {"name", "w"}}}), "tools.0.type"},
      {with("tool_choice", {{"type", "any"}}), "tool_choice"},
      {with("tool_choice", {{"type", "maybe"}}), "tool_choice.type"},
      {with("metadata", "x"), "metadata"},
  };
  json forced = with("tools", {{{"name", "f"}, {"input_schema", {{"type", "object"}, {"properties", {{"a", {{"type", "strin"}}}}}}}}});
  forced["tool_choice"] = {{"type", "tool"}, {"name", "f"}};
  cases.push_back({forced, "properties/a/type"});
  for (auto& c : cases) {
    int st = 0;
    json r = post_json(demo->port(), "/v1/messages", c.body, &st);
    EXPECT_EQ(st, 400) << c.body.dump() << " -> " << r.dump();
    EXPECT_EQ(r["type"], "error") << r.dump();
    EXPECT_EQ(r["error"]["type"], "invalid_request_error") << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find(c.names), std::string::npos) << c.names << ": " << r.dump();
  }
  int st = 0;
  json r = post_json(demo->port(), "/v1/messages", ok, &st, {{"anthropic-version", "latest"}});
  EXPECT_EQ(st, 400);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("anthropic-version"), std::string::npos) << r.dump();
  auto c = client(demo->port());
  auto res = c.Post("/v1/messages", "{not json", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["type"], "error") << res->body;
}

// ---- Responses ----

TEST(ResponsesApi, ResponseShapeStreamAndContinuation) {
  NEED_DEMO();
  int st = 0;
  json body = {{"model", "gpt-x"}, {"input", "Hello"}, {"instructions", "Be brief."}, {"max_output_tokens", 6}, {"temperature", 0},
               {"reasoning", {{"effort", "none"}}}};
  json r = post_json(demo->port(), "/v1/responses", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["model"], "lily-demo");
  EXPECT_TRUE(r["status"] == "completed" || r["status"] == "incomplete");
  ASSERT_FALSE(r["output"].empty());
  EXPECT_EQ(r["output"].back()["type"], "message");
  const std::string text = r["output"].back()["content"][0]["text"];

  body["stream"] = true;
  auto s = post_stream(demo->port(), "/v1/responses", body);
  ASSERT_EQ(s.status, 200);
  auto ev = named_events(s.raw);
  ASSERT_GE(ev.size(), 4u);
  EXPECT_EQ(ev[0].first, "response.created");
  EXPECT_EQ(ev[1].first, "response.in_progress");
  std::string streamed;
  int64_t seq = -1;
  for (auto& [name, d] : ev) {
    EXPECT_EQ(d["type"], name);
    EXPECT_EQ(d["sequence_number"].get<int64_t>(), seq + 1);
    seq = d["sequence_number"];
    if (name == "response.output_text.delta") streamed += d["delta"].get<std::string>();
  }
  EXPECT_EQ(streamed, text);
  EXPECT_TRUE(ev.back().first == "response.completed" || ev.back().first == "response.incomplete") << ev.back().first;

  json next = post_json(demo->port(), "/v1/responses",
                        {{"previous_response_id", r["id"]}, {"input", "Again"}, {"instructions", "Be brief."}, {"max_output_tokens", 3}}, &st);
  ASSERT_EQ(st, 200) << next.dump();
  EXPECT_EQ(next["previous_response_id"], r["id"]);
  EXPECT_GT(next["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0) << next["usage"].dump();
  auto c = client(demo->port());
  auto got = c.Get(("/v1/responses/" + r["id"].get<std::string>()).c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body)["id"], r["id"]);
}

TEST(ResponsesApi, StructuredOutputAndForcedCall) {
  NEED_DEMO();
  int st = 0;
  json j = post_json(demo->port(), "/v1/responses",
                     {{"input", "JSON"}, {"max_output_tokens", 40}, {"reasoning", {{"effort", "none"}}},
                      {"text", {{"format", {{"type", "json_schema"}, {"name", "w"}, {"schema", kWeatherSchema}, {"strict", true}}}}}},
                     &st);
  ASSERT_EQ(st, 200) << j.dump();
  std::string out;
  for (auto& o : j["output"])
    if (o["type"] == "message") out += o["content"][0]["text"].get<std::string>();
  EXPECT_TRUE(valid_weather(json::parse(out, nullptr, false))) << out;
  json t = post_json(demo->port(), "/v1/responses",
                     {{"input", "Weather?"}, {"max_output_tokens", 128}, {"tool_choice", "required"}, {"parallel_tool_calls", false},
                      {"tools", {{{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeatherSchema}}}}},
                     &st);
  ASSERT_EQ(st, 200) << t.dump();
  int calls = 0;
  for (auto& o : t["output"]) {
    if (o["type"] != "function_call") continue;
    ++calls;
    EXPECT_EQ(o["name"], "get_weather");
    EXPECT_TRUE(valid_weather(json::parse(o["arguments"].get<std::string>(), nullptr, false))) << o.dump();
  }
  EXPECT_EQ(calls, 1) << t.dump();
}

TEST(ResponsesApi, MalformedFieldsNameTheParam) {
  NEED_DEMO();
  json ok = {{"input", "x"}, {"max_output_tokens", 2}};
  auto with = [&](const char* k, json v) {
    json b = ok;
    if (v.is_null()) b.erase(k);
    else b[k] = v;
    return b;
  };
  std::vector<std::pair<json, std::string>> cases = {
      {with("input", nullptr), "input"},
      {with("input", 3), "input"},
      {with("input", {{{"type", "message"}, {"role", "robot"}, {"content", "x"}}}), "input[0].role"},
      {with("input", {{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}}), "input[0].call_id"},
      {with("input", {{{"type", "function_call_output"}, {"call_id", "c"}}}), "input[0].output"},
      {with("input", {{{"type", "input_image"}}}), "input[0].type"},
      {with("instructions", 1), "instructions"},
      {with("max_output_tokens", 0), "max_output_tokens"},
      {with("temperature", 3), "temperature"},
      {with("tools", {{{"type", "web_search"}}}), "tools[0].type"},
      {with("tool_choice", "required"), "tool_choice"},
      {with("text", {{"format", {{"type", "yaml"}}}}), "text.format.type"},
      {with("text", {{"format", {{"type", "json_schema"}}}}), "text.format.schema"},
      {with("text", {{"format", {{"type", "json_schema"}, {"schema", {{"type", "strin"}}}}}}), "text.format.schema"},
      {with("reasoning", {{"effort", "max"}}), "reasoning.effort"},
      {with("previous_response_id", "resp_missing"), "previous_response_id"},
  };
  for (auto& [body, param] : cases) {
    int st = 0;
    json r = post_json(demo->port(), "/v1/responses", body, &st);
    EXPECT_EQ(st, 400) << body.dump() << " -> " << r.dump();
    EXPECT_EQ(r["error"]["param"], param) << body.dump() << " -> " << r.dump();
  }
}

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
