// The Anthropic Messages API over HTTP on the demo model: reply shapes and usage, the streamed event
// sequence (message_start usage equal to the final usage, block indices across thinking / text /
// tool_use blocks, input_json_delta), forced tool calls under tight max_tokens, the thinking budget,
// tool calls written inside the think block, disable_parallel_tool_use, stop sequences, server-side
// speculation, and every malformed field or refused request in Anthropic's envelope with its status.
#include <atomic>
#include <cctype>
#include <thread>

#include <fmt/format.h>

#include "api_fixture.h"

namespace lily::server::test {
namespace {

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
  auto s = post_sse(demo->port(), "/v1/messages", body);
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
      {with("thinking", {{"type", "enabled"}, {"budget_tokens", "x"}}), "thinking.budget_tokens"},
      {with("thinking", {{"type", "enabled"}, {"budget_tokens", 0}}), "thinking.budget_tokens"},
      {with("tool_choice", {{"type", "auto"}, {"disable_parallel_tool_use", "yes"}}), "tool_choice.disable_parallel_tool_use"},
      {with("messages", {{{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", "a"}, {"is_error", "yes"}}}}}}),
       "messages.0.content.0.is_error"},
      {with("messages", {{{"role", "assistant"}, {"content", {{{"type", "thinking"}, {"thinking", 5}}}}}}), "messages.0.content.0.thinking"},
      {with("system", {{{"type", "image"}}}), "system.0.type"},
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

// message_start's usage is the final usage (the prompt cache's share known at admission), and the two
// parts add up to count_tokens; a repeated request reads its prompt from the cache from the start.
TEST(AnthropicApi, StreamUsageIsTheFinalUsageFromTheStart) {
  NEED_DEMO();
  json body = {{"model", "m"}, {"max_tokens", 4}, {"stream", true}, {"system", "Usage check."},
               {"messages", {{{"role", "user"}, {"content", "Count me."}}}}};
  int st = 0;
  json count = post_json(demo->port(), "/v1/messages/count_tokens", body, &st);
  ASSERT_EQ(st, 200) << count.dump();
  for (int round = 0; round < 2; ++round) {
    auto s = post_sse(demo->port(), "/v1/messages", body);
    ASSERT_EQ(s.status, 200) << s.raw;
    auto ev = named_events(s.raw);
    ASSERT_GE(ev.size(), 5u) << s.raw;
    ASSERT_EQ(ev[0].first, "message_start");
    const json& u0 = ev[0].second["message"]["usage"];
    const json* u1 = nullptr;
    for (auto& [name, d] : ev)
      if (name == "message_delta") u1 = &d["usage"];
    ASSERT_TRUE(u1) << s.raw;
    EXPECT_EQ(u0["input_tokens"], (*u1)["input_tokens"]) << s.raw;
    EXPECT_EQ(u0["cache_read_input_tokens"], (*u1)["cache_read_input_tokens"]) << s.raw;
    EXPECT_EQ(u0["input_tokens"].get<int>() + u0["cache_read_input_tokens"].get<int>(), count["input_tokens"].get<int>());
    EXPECT_EQ(u0["output_tokens"], 0);
    EXPECT_GT((*u1)["output_tokens"].get<int>(), 0);
    if (round == 1) {
      EXPECT_GT(u0["cache_read_input_tokens"].get<int>(), 0) << "the same prompt again: " << u0.dump();
    }
  }
}

// The blocks of one streamed reply: content_block_start at index 0, 1, 2, ... in order, each delta and
// stop at the open block's index, one block at a time; returns the blocks as the SDKs accumulate them.
json accumulate_blocks(const std::vector<std::pair<std::string, json>>& ev) {
  json blocks = json::array();
  int open = -1;
  std::string partial;
  for (auto& [name, d] : ev) {
    EXPECT_EQ(d["type"], name);
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block started inside another";
      open = d["index"];
      EXPECT_EQ(open, int(blocks.size())) << "indices count the blocks";
      blocks.push_back(d["content_block"]);
      partial.clear();
    } else if (name == "content_block_delta") {
      EXPECT_EQ(d["index"], open);
      if (open < 0) continue;
      json& b = blocks[size_t(open)];
      const json& x = d["delta"];
      if (x["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + x["text"].get<std::string>();
      else if (x["type"] == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + x["thinking"].get<std::string>();
      else if (x["type"] == "input_json_delta") partial += x["partial_json"].get<std::string>();
      else ADD_FAILURE() << "unknown delta " << x.dump();
      EXPECT_EQ(x["type"], b["type"] == "text" ? "text_delta" : b["type"] == "thinking" ? "thinking_delta" : "input_json_delta");
    } else if (name == "content_block_stop") {
      EXPECT_EQ(d["index"], open);
      if (open >= 0 && blocks[size_t(open)]["type"] == "tool_use") blocks[size_t(open)]["input"] = json::parse(partial, nullptr, false);
      open = -1;
    }
  }
  EXPECT_EQ(open, -1) << "a block left open";
  return blocks;
}

// A reply with reasoning, a tool call written inside the think block, more reasoning, text and a second
// call: thinking, tool_use, thinking, text, tool_use blocks, streamed and not; no markup or reasoning in
// the text; with disable_parallel_tool_use (tool_choice auto) the reply ends after the first call.
TEST(AnthropicApi, ToolCallsInsideThinkingAreToolUseBlocks) {
  NEED_SCRIPTED();
  sd->script(kThinkAndCallsScript);
  json body = {{"model", "m"}, {"max_tokens", 200}, {"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
               {"tools", {{{"name", "get_weather"}, {"input_schema", kWeatherSchema}}}},
               {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}}};
  int st = 0;
  json r = post_json(sd->port(), "/v1/messages", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  const json& c = r["content"];
  ASSERT_EQ(c.size(), 5u) << r.dump();
  EXPECT_EQ(c[0]["type"], "thinking");
  EXPECT_EQ(c[0]["thinking"], kScriptReasoning[0]);
  EXPECT_EQ(c[1]["type"], "tool_use");
  EXPECT_EQ(c[1]["name"], "get_weather");
  EXPECT_EQ(c[1]["input"], kScriptCalls[0]);
  EXPECT_EQ(c[2]["type"], "thinking");
  EXPECT_EQ(c[2]["thinking"], kScriptReasoning[1]);
  EXPECT_EQ(c[3]["type"], "text");
  EXPECT_EQ(c[3]["text"], kScriptText);
  EXPECT_EQ(c[4]["type"], "tool_use");
  EXPECT_EQ(c[4]["input"], kScriptCalls[1]);
  EXPECT_NE(c[1]["id"], c[4]["id"]);
  EXPECT_EQ(c[1]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(r["stop_reason"], "tool_use");

  json sb = body;
  sb["stream"] = true;
  auto s = post_sse(sd->port(), "/v1/messages", sb);
  ASSERT_EQ(s.status, 200) << s.raw;
  auto ev = named_events(s.raw);
  json blocks = accumulate_blocks(ev);
  ASSERT_EQ(blocks.size(), c.size()) << s.raw;
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(blocks[i]["type"], c[i]["type"]) << i;
    if (c[i]["type"] == "tool_use") {
      EXPECT_EQ(blocks[i]["input"], c[i]["input"]) << i;
      EXPECT_EQ(blocks[i]["name"], c[i]["name"]) << i;
    } else {
      const char* key = c[i]["type"] == "text" ? "text" : "thinking";
      EXPECT_EQ(blocks[i][key], c[i][key]) << i;
    }
  }
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back().first, "message_stop");
  EXPECT_EQ(ev[ev.size() - 2].first, "message_delta");
  EXPECT_EQ(ev[ev.size() - 2].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[ev.size() - 2].second["usage"]["output_tokens"], r["usage"]["output_tokens"]);

  // One call at most: the reply ends after it.
  json one = body;
  one["tool_choice"] = {{"type", "auto"}, {"disable_parallel_tool_use", true}};
  json r1 = post_json(sd->port(), "/v1/messages", one, &st);
  ASSERT_EQ(st, 200) << r1.dump();
  ASSERT_EQ(r1["content"].size(), 2u) << r1.dump();
  EXPECT_EQ(r1["content"][0]["type"], "thinking");
  EXPECT_EQ(r1["content"][1]["input"], kScriptCalls[0]);
  EXPECT_EQ(r1["stop_reason"], "tool_use");
  EXPECT_LT(r1["usage"]["output_tokens"].get<int>(), r["usage"]["output_tokens"].get<int>());

  // tool_choice none: the tools leave the prompt, and markup the model writes anyway is no call.
  json none = body;
  none["tool_choice"] = {{"type", "none"}};
  json rn = post_json(sd->port(), "/v1/messages", none, &st);
  ASSERT_EQ(st, 200) << rn.dump();
  for (auto& b : rn["content"]) EXPECT_NE(b["type"], "tool_use") << rn.dump();
  EXPECT_EQ(rn["stop_reason"], "end_turn");
  sd->script("");
}

// Under a forced call the grammar keeps <tool_call> out of the think block, where the output parser
// would take it for a call and swallow the forced one: a model that starts one there still ends with
// exactly the forced call.
TEST(AnthropicApi, ForcedCallWithThinkingStaysOneCall) {
  NEED_SCRIPTED();
  sd->script("<think>\nI will call <tool_call> now.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
             "{\"city\": \"Rome\", \"days\": 3}}\n</tool_call>");
  json body = {{"model", "m"}, {"max_tokens", 60}, {"temperature", 0}, {"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
               {"tools", {{{"name", "get_weather"}, {"input_schema", kWeatherSchema}}}},
               {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
               {"thinking", {{"type", "enabled"}, {"budget_tokens", 40}}}};
  int st = 0;
  json r = post_json(sd->port(), "/v1/messages", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  int calls = 0;
  for (auto& b : r["content"]) {
    if (b["type"] == "tool_use") {
      ++calls;
      EXPECT_TRUE(valid_weather(b["input"])) << r.dump();
    } else {
      EXPECT_EQ(b["type"], "thinking") << r.dump();
      EXPECT_EQ(b["thinking"].get<std::string>().find("<tool_call>"), std::string::npos) << r.dump();
    }
  }
  EXPECT_EQ(calls, 1) << r.dump();
  EXPECT_EQ(r["stop_reason"], "tool_use") << r.dump();
  sd->script("");
}

// thinking.budget_tokens ends the block: with the Qwen3.5-style template the prompt opens <think>, and the
// random model never closes it by itself; with a budget of B the greedy block holds exactly the first B
// tokens of the unbudgeted reply (its ids from chat completions' return_tokens) and the reply goes on as
// text after the forced </think>.
TEST(AnthropicApi, ThinkingBudgetClosesTheBlock) {
  auto* d = qwen35_demo();
  if (!d) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  const json user = {{{"role", "user"}, {"content", "Think."}}};
  auto ask = [&](std::optional<int> budget) {
    json b = {{"model", "m"}, {"max_tokens", 40}, {"temperature", 0}, {"messages", user},
              {"thinking", {{"type", "enabled"}, {"budget_tokens", budget.value_or(100000)}}}};
    int st = 0;
    json r = post_json(d->port(), "/v1/messages", b, &st);
    EXPECT_EQ(st, 200) << r.dump();
    return r;
  };
  json free = ask(std::nullopt);
  ASSERT_EQ(free["content"].size(), 1u) << free.dump();
  ASSERT_EQ(free["content"][0]["type"], "thinking") << free.dump();
  EXPECT_EQ(free["stop_reason"], "max_tokens");
  int st = 0;
  json chat = post_json(d->port(), "/v1/chat/completions",
                        {{"messages", user}, {"max_tokens", 40}, {"temperature", 0}, {"return_tokens", true},
                         {"chat_template_kwargs", {{"enable_thinking", true}}}}, &st);
  ASSERT_EQ(st, 200) << chat.dump();
  const auto ids = chat["choices"][0]["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 40u);
  auto trim = [](std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i);
  };
  EXPECT_EQ(trim(free["content"][0]["thinking"]), trim(d->tok->decode(ids, true))) << "the same greedy reply";
  for (int budget : {4, 12}) {
    json r = ask(budget);
    ASSERT_GE(r["content"].size(), 2u) << "budget " << budget << ": " << r.dump();
    EXPECT_EQ(r["content"][0]["type"], "thinking");
    EXPECT_EQ(r["content"][1]["type"], "text") << r.dump();
    const std::vector<int32_t> first(ids.begin(), ids.begin() + budget);
    EXPECT_EQ(trim(r["content"][0]["thinking"]), trim(d->tok->decode(first, true))) << "budget " << budget;
  }
  // Thinking off: the template closes the block in the prompt, the reply has none.
  json off = post_json(d->port(), "/v1/messages", {{"model", "m"}, {"max_tokens", 8}, {"messages", {{{"role", "user"}, {"content", "Hi."}}}}});
  for (auto& b : off["content"]) EXPECT_NE(b["type"], "thinking") << off.dump();
}

// Refusals in Anthropic's envelope and status: a body over the limit (413 request_too_large), other
// paths and methods of the API (404 not_found_error, 405), and ?beta=true (what the SDK's beta client
// and Claude Code send) served like the plain path.
TEST(AnthropicApi, RefusalsOfTheTransportAndRoutesInTheEnvelope) {
  NEED_DEMO();
  auto c = client(demo->port());
  auto expect = [](const httplib::Result& r, int status, const char* type) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], type) << r->body;
  };
  json big = {{"model", "m"}, {"max_tokens", 1}, {"messages", {{{"role", "user"}, {"content", std::string(2 << 20, 'a')}}}}};
  expect(c.Post("/v1/messages", big.dump(), "application/json"), 413, "request_too_large");
  expect(c.Post("/v1/messages/batches", "{}", "application/json"), 404, "not_found_error");
  expect(c.Get("/v1/messages/batches/x"), 404, "not_found_error");
  auto g = c.Get("/v1/messages");
  expect(g, 405, "invalid_request_error");
  EXPECT_EQ(g->get_header_value("Allow"), "POST");
  json ok = {{"model", "m"}, {"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "x"}}}}};
  int st = 0;
  json r = post_json(demo->port(), "/v1/messages?beta=true", ok, &st, {{"anthropic-version", "2023-06-01"}, {"anthropic-beta", "x"}});
  EXPECT_EQ(st, 200) << r.dump();
  json n = post_json(demo->port(), "/v1/messages/count_tokens?beta=true", ok, &st);
  EXPECT_EQ(st, 200) << n.dump();
  EXPECT_GT(n["input_tokens"].get<int>(), 0);
}

// A full queue answers 529 overloaded_error with Retry-After, as Anthropic's API does.
TEST(AnthropicApi, FullQueueIsOverloaded529) {
  const std::string dir = tokenizer_dir();
  if (dir.empty()) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";
  std::shared_ptr<const text::Tokenizer> tok = text::Tokenizer::load(dir);
  ServerOptions so;
  so.sched.parallel = 1;
  so.sched.max_queue = 1;
  auto srv = start_server(narrow_demo(*tok), tok, dir, so, 1 << 14, 256);
  const int port = srv->port();
  std::atomic<bool> release{false};
  std::vector<std::thread> th;
  for (int i = 0; i < 2; ++i)
    th.emplace_back([&, i] {
      json b = {{"prompt", {1, 2, 3, i}}, {"max_tokens", 16000}, {"stream", true}, {"temperature", 1}};
      post_sse(port, "/v1/completions", b, [&](const SseResult&) { return !release.load(); });
    });
  for (int i = 0; i < 400 && metric(port, "lily_requests_active") + metric(port, "lily_queue_depth") < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto c = client(port);
  json body = {{"model", "m"}, {"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "x"}}}}};
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    auto r = c.Post("/v1/messages", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 529) << r->body;
    ASSERT_TRUE(r->has_header("Retry-After"));
    EXPECT_GE(std::stoi(r->get_header_value("Retry-After")), 1) << r->body;
    json j = json::parse(r->body, nullptr, false);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], "overloaded_error") << r->body;
  }
  release = true;
  for (auto& t : th) t.join();
}

}  // namespace
}  // namespace lily::server::test
