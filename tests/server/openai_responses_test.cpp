// The OpenAI Responses API over HTTP on the demo model: the response object, the typed event stream
// (sequence_number on every event, output_index / content_index, item ids), previous_response_id from the
// store, structured output and forced calls, reasoning and function_call items for a reply that calls a
// tool inside its think block, parallel_tool_calls false, max_output_tokens as status "incomplete", and
// malformed fields as 400s naming the param.
#include <fmt/format.h>

#include "api_fixture.h"
#include "server/openai_responses.h"

namespace lily::server::test {
namespace {

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
  auto s = post_sse(demo->port(), "/v1/responses", body);
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

// Checks the typed stream of one response and returns its final response object: consecutive
// sequence_numbers from 0, response.created then response.in_progress, items added at output_index
// 0, 1, 2, ... one at a time, every delta / part / done event at the open item with content_index 0, and
// each output_item.done item equal to the final object's item at that index.
json check_stream(const std::vector<std::pair<std::string, json>>& ev) {
  EXPECT_GE(ev.size(), 3u);
  if (ev.size() < 3) return json();
  EXPECT_EQ(ev[0].first, "response.created");
  EXPECT_EQ(ev[1].first, "response.in_progress");
  EXPECT_EQ(ev[0].second["response"]["status"], "in_progress");
  const json fin = ev.back().second["response"];
  int open = -1, items = 0;
  std::string open_id;
  for (size_t i = 0; i < ev.size(); ++i) {
    const auto& [name, d] = ev[i];
    EXPECT_EQ(d["type"], name);
    EXPECT_EQ(d["sequence_number"], int64_t(i)) << name;
    if (name == "response.output_item.added") {
      EXPECT_EQ(open, -1) << "an item added while another is open";
      EXPECT_EQ(d["output_index"], items);
      open = items++;
      open_id = d["item"]["id"];
      EXPECT_EQ(d["item"]["status"], "in_progress");
    } else if (name == "response.output_item.done") {
      EXPECT_EQ(d["output_index"], open);
      EXPECT_EQ(d["item"]["id"], open_id);
      if (open >= 0 && size_t(open) < fin["output"].size()) {
        EXPECT_EQ(d["item"], fin["output"][size_t(open)]) << name;
      }
      open = -1;
    } else if (d.contains("item_id")) {
      EXPECT_EQ(d["item_id"], open_id) << name;
      EXPECT_EQ(d["output_index"], open) << name;
      if (d.contains("content_index")) {
        EXPECT_EQ(d["content_index"], 0) << name;
      }
    }
  }
  EXPECT_EQ(open, -1);
  EXPECT_EQ(items, int(fin["output"].size()));
  return fin;
}

// Reasoning, a call written inside the think block, more reasoning, text and a second call: reasoning,
// function_call, reasoning, message, function_call items (rs_ / fc_ / msg_ ids, call_ids), streamed and
// not; parallel_tool_calls false ends the reply after the first call; the calls continue through
// previous_response_id with their outputs.
TEST(ResponsesApi, ToolCallsInsideThinkingAreFunctionCallItems) {
  NEED_SCRIPTED();
  sd->script(kThinkAndCallsScript);
  const json tools = {{{"type", "function"}, {"name", "get_weather"}, {"parameters", kWeatherSchema}}};
  json body = {{"model", "codex"}, {"input", "Weather?"}, {"tools", tools}, {"max_output_tokens", 200}, {"reasoning", {{"effort", "high"}}}};
  int st = 0;
  json r = post_json(sd->port(), "/v1/responses", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["status"], "completed");
  const json& o = r["output"];
  ASSERT_EQ(o.size(), 5u) << r.dump();
  const char* types[] = {"reasoning", "function_call", "reasoning", "message", "function_call"};
  const char* prefixes[] = {"rs_", "fc_", "rs_", "msg_", "fc_"};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(o[i]["type"], types[i]) << i;
    EXPECT_EQ(o[i]["id"].get<std::string>().rfind(prefixes[i], 0), 0u) << o[i].dump();
    EXPECT_EQ(o[i]["status"], "completed") << i;
  }
  EXPECT_EQ(o[0]["content"][0]["type"], "reasoning_text");
  EXPECT_EQ(o[0]["content"][0]["text"], kScriptReasoning[0]);
  EXPECT_EQ(o[2]["content"][0]["text"], kScriptReasoning[1]);
  EXPECT_EQ(o[3]["content"][0]["type"], "output_text");
  EXPECT_EQ(o[3]["content"][0]["text"], kScriptText);
  for (size_t i : {size_t(1), size_t(4)}) {
    EXPECT_EQ(o[i]["name"], "get_weather");
    EXPECT_EQ(o[i]["call_id"].get<std::string>().rfind("call_", 0), 0u) << o[i].dump();
    EXPECT_EQ(json::parse(o[i]["arguments"].get<std::string>()), kScriptCalls[i == 1 ? 0 : 1]);
  }
  EXPECT_NE(o[1]["call_id"], o[4]["call_id"]);
  EXPECT_GT(r["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);

  json sb = body;
  sb["stream"] = true;
  auto s = post_sse(sd->port(), "/v1/responses", sb);
  ASSERT_EQ(s.status, 200);
  auto ev = named_events(s.raw);
  json fin = check_stream(ev);
  EXPECT_EQ(ev.back().first, "response.completed");
  ASSERT_EQ(fin["output"].size(), o.size()) << fin.dump();
  for (size_t i = 0; i < o.size(); ++i) {
    EXPECT_EQ(fin["output"][i]["type"], o[i]["type"]);
    EXPECT_EQ(fin["output"][i].value("arguments", ""), o[i].value("arguments", ""));
    EXPECT_EQ(fin["output"][i].value("content", json()), o[i].value("content", json()));
  }
  std::string args, reasoning;
  for (auto& [name, d] : ev) {
    if (name == "response.function_call_arguments.delta") args += d["delta"].get<std::string>();
    if (name == "response.reasoning_text.delta") reasoning += d["delta"].get<std::string>();
  }
  EXPECT_EQ(args, o[1]["arguments"].get<std::string>() + o[4]["arguments"].get<std::string>());
  EXPECT_EQ(reasoning, std::string(kScriptReasoning[0]) + kScriptReasoning[1]);

  json one = body;
  one["parallel_tool_calls"] = false;
  json r1 = post_json(sd->port(), "/v1/responses", one, &st);
  ASSERT_EQ(st, 200) << r1.dump();
  ASSERT_EQ(r1["output"].size(), 2u) << r1.dump();
  EXPECT_EQ(r1["output"][1]["type"], "function_call");
  EXPECT_EQ(r1["status"], "completed");

  sd->script("Done.");
  json next = post_json(sd->port(), "/v1/responses",
                        {{"previous_response_id", r["id"]}, {"tools", tools}, {"max_output_tokens", 16},
                         {"input", {{{"type", "function_call_output"}, {"call_id", o[1]["call_id"]}, {"output", "18 C"}},
                                    {{"type", "function_call_output"}, {"call_id", o[4]["call_id"]}, {"output", "9 C"}}}}}, &st);
  ASSERT_EQ(st, 200) << next.dump();
  EXPECT_EQ(next["output"].back()["content"][0]["text"], "Done.");
  sd->script("");
}

// max_output_tokens: status "incomplete", incomplete_details.reason max_output_tokens, the cut item
// "incomplete" too; streamed, the last event is response.incomplete with the same object.
TEST(ResponsesApi, MaxOutputTokensIsIncomplete) {
  NEED_DEMO();
  json body = {{"input", "Write a long story."}, {"max_output_tokens", 3}, {"reasoning", {{"effort", "none"}}}, {"temperature", 0}};
  int st = 0;
  json r = post_json(demo->port(), "/v1/responses", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["status"], "incomplete") << r.dump();
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["usage"]["output_tokens"], 3);
  ASSERT_FALSE(r["output"].empty());
  EXPECT_EQ(r["output"].back()["status"], "incomplete") << r.dump();
  body["stream"] = true;
  auto s = post_sse(demo->port(), "/v1/responses", body);
  auto ev = named_events(s.raw);
  json fin = check_stream(ev);
  EXPECT_EQ(ev.back().first, "response.incomplete");
  EXPECT_EQ(fin["status"], "incomplete");
  EXPECT_EQ(fin["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(fin["output"].back()["status"], "incomplete");
}

// A chain of continuations: each one's prompt holds the whole conversation so far (input tokens grow),
// and the prompt cache serves it up to the end of the previous turn's input (the state saved where the
// last message ends: the reply is re-rendered without its think block once a user turn follows);
// store: false leaves nothing to continue.
TEST(ResponsesApi, PreviousResponseIdChains) {
  NEED_DEMO();
  std::string prev;
  int64_t last_input = 0, last_cached = 0;
  for (const char* turn : {"First.", "Second.", "Third."}) {
    json b = {{"input", turn}, {"max_output_tokens", 4}, {"reasoning", {{"effort", "none"}}}};
    if (!prev.empty()) b["previous_response_id"] = prev;
    int st = 0;
    json r = post_json(demo->port(), "/v1/responses", b, &st);
    ASSERT_EQ(st, 200) << r.dump();
    const int64_t input = r["usage"]["input_tokens"];
    EXPECT_GT(input, last_input) << turn;
    const int64_t cached = r["usage"]["input_tokens_details"]["cached_tokens"];
    if (!prev.empty()) {
      EXPECT_EQ(r["previous_response_id"], prev);
      EXPECT_GT(cached, last_cached) << turn << ": " << r["usage"].dump();
      EXPECT_GE(cached, last_input - 8) << turn << ": all but the last turn's generation prompt, " << r["usage"].dump();
    }
    last_input = input;
    last_cached = cached;
    prev = r["id"];
  }
  int st = 0;
  json u = post_json(demo->port(), "/v1/responses", {{"input", "x"}, {"max_output_tokens", 1}, {"store", false}}, &st);
  ASSERT_EQ(st, 200);
  EXPECT_EQ(u["store"], false);
  json c = post_json(demo->port(), "/v1/responses", {{"input", "y"}, {"max_output_tokens", 1}, {"previous_response_id", u["id"]}}, &st);
  EXPECT_EQ(st, 400) << c.dump();
  EXPECT_EQ(c["error"]["param"], "previous_response_id");
  auto g = client(demo->port()).Get(("/v1/responses/" + u["id"].get<std::string>()).c_str());
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 404);
}

// Reasoning items fed back: their reasoning_text content, or the summary when the content is absent or
// empty (as Codex sends them back), becomes the turn's reasoning.
TEST(ResponsesApi, ReasoningItemsFedBackBecomeReasoning) {
  RequestLimits limits;
  for (json item : {json{{"type", "reasoning"}, {"summary", {{{"type", "summary_text"}, {"text", "S."}}}}},
                    json{{"type", "reasoning"}, {"summary", {{{"type", "summary_text"}, {"text", "S."}}}}, {"content", json::array()},
                         {"encrypted_content", nullptr}},
                    json{{"type", "reasoning"}, {"summary", json::array()}, {"content", {{{"type", "reasoning_text"}, {"text", "S."}}}}}}) {
    json b = {{"input", {{{"role", "user"}, {"content", "q"}}, item, {{"type", "message"}, {"role", "assistant"}, {"content", "a"}}}}};
    ResponsesRequest rr = parse_responses_request(b, limits);
    ASSERT_EQ(rr.input.size(), 2u) << rr.input.dump();
    EXPECT_EQ(rr.input[1]["reasoning_content"], "S.") << item.dump();
    EXPECT_EQ(rr.input[1]["content"], "a");
  }
}

}  // namespace
}  // namespace lily::server::test
