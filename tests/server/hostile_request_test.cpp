// Requests against hostile clients: invalid bytes anywhere, out-of-range numbers, linear JSON parsing,
// limits and template errors that name the field, cancellation when the client leaves, a deadline per
// request, and timings that report what the client received.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "hostile_fixture.h"
#include "server/json_body.h"
#include "server/openai_responses.h"

namespace lily::server::test {
namespace {

TEST(Hostile, InvalidUtf8AnywhereGets4xx) {
  NEED_DEMO();
  const int port = demo->port();
  RawReply r = raw_request(port, "GET /%ff HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  expect_envelope(r, 404, nullptr, "not_found");
  EXPECT_NE(parsed(r)["error"]["message"].get<std::string>().find("\xef\xbf\xbd"), std::string::npos);
  expect_envelope(raw_request(port, post_bytes("/v1/chat/completions%ff", chat_json("hi"))), 404);
  expect_envelope(raw_request(port, "GET /%zz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 400);
  // Header values are opaque bytes; an unknown header with invalid UTF-8 changes nothing.
  EXPECT_EQ(raw_request(port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Junk: \xff\xfe\r\nConnection: close\r\n\r\n").status, 200);
  expect_envelope(raw_request(port, "GET /health HTTP/1.1\r\nHost: \xff\xfe\r\nConnection: close\r\n\r\n"), 403);
  // Raw invalid UTF-8 in the body names the field it is in.
  std::string bad_utf8 = chat_json("ok");
  bad_utf8.replace(bad_utf8.find("\"ok\"") + 1, 2, "\xff\xfe");
  expect_envelope(raw_request(port, post_bytes("/v1/chat/completions", bad_utf8)), 400, "messages[0].content", "invalid_json");
  expect_envelope(raw_request(port, post_bytes("/v1/chat/completions", R"({"messages":[{"role":"user","content":"\ud800"}]})")),
                  400, "messages[0].content");
  EXPECT_TRUE(healthy(port));
}

TEST(Hostile, NonStreamingRequestStopsWhenTheClientLeaves) {
  NEED_DEMO();
  const int port = demo->port();
  double cancelled0 = metric(port, "lily_requests_cancelled_total");
  double gen0 = metric(port, "lily_generated_tokens_total");
  int fd = connect_port(port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, post_bytes("/v1/chat/completions", chat_json("Go on and on.", 3000, ",\"cache_prompt\":false"))));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::close(fd);
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    seen = metric(port, "lily_requests_cancelled_total") > cancelled0;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(seen) << "the abandoned request kept its slot";
  EXPECT_LT(metric(port, "lily_generated_tokens_total") - gen0, 1500);
  EXPECT_EQ(metric(port, "lily_requests_active"), 0);
}

TEST(Hostile, RequestTimeoutEndsAGenerationAsLength) {
  ServerOptions so;
  so.request_timeout_s = 0.5;
  auto srv = small_server(so, 1 << 17);
  auto t0 = Clock::now();
  int st = 0;
  json r = post_json(srv->port(), "/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 120000}, {"temperature", 1}}, &st);
  EXPECT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_LT(r["usage"]["completion_tokens"].get<int64_t>(), 120000);
  EXPECT_LT(since_ms(t0), 5000);
  // Streams end the same way.
  auto s = post_sse(srv->port(), "/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 120000}, {"stream", true}});
  ASSERT_TRUE(s.done);
  EXPECT_EQ(s.events.back()["choices"][0]["finish_reason"], "length");
}

TEST(Hostile, JsonParsingIsLinear) {
  // 100k keys: ordered_json's own parser inserts each key with a linear search (seconds per MB).
  std::string obj = "{";
  for (int i = 0; i < 100000; ++i) obj += fmt::format("{}\"k{}\":{}", i ? "," : "", i, i);
  obj += "}";
  JsonLimits lim;
  lim.object_keys = 200000;
  auto t0 = Clock::now();
  json j = parse_json(obj, lim);
  double ms = since_ms(t0);
  ASSERT_EQ(j.size(), 100000u);
  EXPECT_EQ(j.begin().key(), "k0");  // insertion order kept
  EXPECT_EQ(j["k99999"], 99999);
  EXPECT_LT(ms, 1500 * kSlowdown) << "100k-key object";
  // Inside a string too: a Responses function_call's arguments are parsed the same way.
  json input = json::array({{{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", obj}},
                            {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "ok"}}});
  RequestLimits rl;
  rl.json.object_keys = 200000;
  t0 = Clock::now();
  ResponsesRequest rr = parse_responses_request(json{{"input", input}}, rl);
  EXPECT_LT(since_ms(t0), 1500 * kSlowdown) << "100k-key function_call arguments";
  EXPECT_EQ(rr.input[0]["tool_calls"][0]["function"]["arguments"].size(), 100000u) << rr.input[0].dump().substr(0, 200);
  // Beyond the limits the arguments reach the template as the text sent.
  rr = parse_responses_request(json{{"input", input}}, RequestLimits{});
  EXPECT_TRUE(rr.input[0]["tool_calls"][0]["function"]["arguments"].is_string());
  // Over HTTP, in a field the API ignores, on a server that allows that many keys.
  ServerOptions so;
  so.limits.json.object_keys = 200000;
  auto srv = small_server(so);
  std::string body = R"({"prompt":[1,2,3],"max_tokens":1,"metadata":)" + obj + "}";
  t0 = Clock::now();
  RawReply r = raw_request(srv->port(), post_bytes("/v1/completions", body));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_LT(since_ms(t0), 3000 * kSlowdown);
  // The default limit (4096 keys) refuses such an object, naming it.
  NEED_DEMO();
  std::string five = "{";
  for (int i = 0; i < 5000; ++i) five += fmt::format("{}\"k{}\":{}", i ? "," : "", i, i);
  five += "}";
  expect_envelope(raw_request(demo->port(), post_bytes("/v1/completions", R"({"prompt":[1],"metadata":)" + five + "}")), 400,
                  "metadata", "limit_exceeded");
  // Duplicate keys are refused, not silently resolved.
  expect_envelope(raw_request(demo->port(), post_bytes("/v1/completions", R"({"prompt":[1],"max_tokens":1,"max_tokens":9})")), 400,
                  "max_tokens");
}

TEST(Hostile, OutOfRangeNumbersGet400NamingTheField) {
  NEED_DEMO();
  const int port = demo->port();
  struct Case {
    std::string extra, param;
  };
  const std::vector<Case> cases = {
      {R"(,"temperature":1e400)", "temperature"},       {R"(,"temperature":-1e400)", "temperature"},
      {R"(,"top_p":1e999)", "top_p"},                   {R"(,"max_tokens":1e400)", "max_tokens"},
      {R"(,"max_tokens":1e30)", "max_tokens"},          {R"(,"max_tokens":18446744073709551615)", "max_tokens"},
      {R"(,"top_k":18446744073709551615)", "top_k"},    {R"(,"seed":1e400)", "seed"},
      {R"(,"seed":1.5)", "seed"},                       {R"(,"presence_penalty":1e39)", "presence_penalty"},
      {R"(,"repetition_penalty":1e39)", "repetition_penalty"}, {R"(,"logit_bias":{"5":1e400})", "logit_bias.5"},
      {R"(,"logit_bias":{"99999999999999999999":1})", "logit_bias"}, {R"(,"top_logprobs":1e20,"logprobs":true)", "top_logprobs"},
      {R"(,"n":1e400)", "n"},                            {R"(,"stream_options":{"include_usage":1e400})", "stream_options.include_usage"},
      {R"(,"stream_options":{"include_usage":"yes"})", "stream_options.include_usage"},
  };
  for (auto& c : cases) {
    RawReply r = raw_request(port, post_bytes("/v1/chat/completions", chat_json("x", 2, c.extra)));
    expect_envelope(r, 400, c.param.c_str());
  }
  for (const char* bad : {R"({"temperature":NaN})", R"({"temperature":Infinity})", R"({"temperature":-Infinity})", "{\"a\":\"\x01\"}"}) {
    RawReply r = raw_request(port, post_bytes("/v1/chat/completions", bad));
    expect_envelope(r, 400, nullptr, "invalid_json");
  }
  // Malformed number text reads as a number and then a syntax error: the member it follows is named.
  for (const char* raw : {"01", "0x10", "1e", "-", "1.5.2", "+1"}) {
    RawReply m = raw_request(port, post_bytes("/v1/chat/completions", chat_json("x", 2, std::string(R"(,"top_k":)") + raw)));
    expect_envelope(m, 400, "top_k", "invalid_json");
    m = raw_request(port, post_bytes("/v1/chat/completions", chat_json("x", 2, std::string(R"(,"stream_options":{"include_usage":)") + raw + "}")));
    expect_envelope(m, 400, nullptr, "invalid_json");
    EXPECT_NE(parsed(m)["error"]["param"].get<std::string>().find("stream_options"), std::string::npos) << m.body;
    m = raw_request(port, post_bytes("/v1/messages", std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":)") + raw + "}"));
    EXPECT_EQ(m.status, 400) << m.body;
    EXPECT_EQ(parsed(m)["type"], "error") << m.body;
    EXPECT_NE(parsed(m)["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos) << m.body;
  }
  RawReply r = raw_request(port, post_bytes("/v1/completions", R"({"prompt":[1,2,1e400]})"));
  expect_envelope(r, 400, "prompt[2]");
  r = raw_request(port, post_bytes("/v1/completions", R"({"prompt":[1,2,18446744073709551615]})"));
  expect_envelope(r, 400, "prompt");
  EXPECT_TRUE(healthy(port));
}

TEST(Hostile, MessagesNameTheFieldAndHideServerPaths) {
  NEED_DEMO();
  const int port = demo->port();
  // Context overflow on /v1/completions names the prompt.
  std::string longp = std::string(30000, 'z') + " " + std::string(30000, 'q');
  RawReply r = raw_request(port, post_bytes("/v1/completions", json{{"prompt", longp}, {"max_tokens", 2}}.dump()));
  expect_envelope(r, 400, "prompt", "context_length_exceeded");
  // A text part whose text is not a string says so.
  r = raw_request(port, post_bytes("/v1/chat/completions", R"({"messages":[{"role":"user","content":[{"type":"text","text":5}]}]})"));
  expect_envelope(r, 400, "messages[0].content[0].text");
  EXPECT_NE(parsed(r)["error"]["message"].get<std::string>().find("must be a string"), std::string::npos) << r.body;
  r = raw_request(port, post_bytes("/v1/chat/completions", R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})"));
  expect_envelope(r, 400, "messages[0].content[0].type");
  // A tool whose type is not a string (found by fuzz_chat_request: a json type_error escaped, a 500).
  for (const char* type : {R"({})", "[]", "5", "true", R"("other")"}) {
    r = raw_request(port, post_bytes("/v1/chat/completions", fmt::format(R"({{"messages":[{{"role":"user","content":"x"}}],
        "tools":[{{"type":{},"function":{{"name":"f"}}}}]}})", type)));
    expect_envelope(r, 400, "tools[0]");
  }

  // A template that fails while rendering: the error gives line and column, not the file it came from.
  auto dir = std::filesystem::temp_directory_path() / fmt::format("lily-tpl-{}", getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::filesystem::path(tokenizer_dir()) / "tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}";
  auto tok = text::Tokenizer::load(dir.string());
  DemoModelOptions d;
  d.vocab = tok->vocab_size();
  d.layers = 1;
  auto srv = start_server(make_demo_weights(d), tok, dir.string(), ServerOptions{});
  r = raw_request(srv->port(), post_bytes("/v1/chat/completions", chat_json("hi")));
  expect_envelope(r, 400, "messages", "template_error");
  std::string msg = parsed(r)["error"]["message"];
  EXPECT_EQ(msg.find(dir.string()), std::string::npos) << msg;
  EXPECT_EQ(msg.find(".jinja"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 1"), std::string::npos) << msg;
  srv.reset();
  std::filesystem::remove_all(dir);
}

TEST(Hostile, LimitsNameTheField) {
  NEED_DEMO();
  const int port = demo->port();
  json tools = json::array();
  for (int i = 0; i < 129; ++i)
    tools.push_back({{"type", "function"}, {"function", {{"name", fmt::format("f{}", i)}, {"parameters", {{"type", "object"}}}}}});
  auto chat = [&](json extra) {
    json b = json::parse(chat_json("x"));
    for (auto& [k, v] : extra.items()) b[k] = v;
    return raw_request(port, post_bytes("/v1/chat/completions", b.dump()));
  };
  expect_envelope(chat({{"tools", tools}}), 400, "tools", "limit_exceeded");
  json stops = json::array();
  for (int i = 0; i < 17; ++i) stops.push_back(fmt::format("s{}", i));
  expect_envelope(chat({{"stop", stops}}), 400, "stop", "limit_exceeded");
  expect_envelope(chat({{"stop", std::string(300, 's')}}), 400, "stop", "limit_exceeded");
  json lb = json::object();
  for (int i = 0; i < 1025; ++i) lb[std::to_string(i)] = 1;
  expect_envelope(chat({{"logit_bias", lb}}), 400, "logit_bias", "limit_exceeded");
  // The same limits hold for the Anthropic Messages and Responses requests.
  json messages = {{"model", "m"}, {"max_tokens", 2}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}};
  auto anthropic_refuses = [&](const char* key, json value) {
    json b = messages;
    b[key] = std::move(value);
    RawReply r = raw_request(port, post_bytes("/v1/messages", b.dump()));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(parsed(r)["error"]["message"].get<std::string>().rfind(std::string(key) + ":", 0), 0u) << r.body;
  };
  json anthropic_tools = json::array();
  for (int i = 0; i < 129; ++i) anthropic_tools.push_back({{"name", fmt::format("f{}", i)}, {"input_schema", {{"type", "object"}}}});
  anthropic_refuses("tools", anthropic_tools);
  anthropic_refuses("stop_sequences", stops);
  anthropic_refuses("stop_sequences", json::array({std::string(300, 's')}));
  json responses_tools = json::array();
  for (int i = 0; i < 129; ++i) responses_tools.push_back({{"type", "function"}, {"name", fmt::format("f{}", i)}});
  expect_envelope(raw_request(port, post_bytes("/v1/responses", json({{"input", "x"}, {"tools", responses_tools}}).dump())), 400,
                  "tools", "limit_exceeded");

  // Schemas that name no finite document or contain themselves: 400 naming the schema's field, for each
  // API that takes one (before, {"$ref": "#"} was a 500 and {"allOf": [{"$ref": "#"}]} overflowed the stack).
  for (const char* schema : {R"({"$ref": "#"})", R"({"allOf": [{"$ref": "#"}]})",
                             R"({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]})"}) {
    const json sc = json::parse(schema);
    expect_envelope(chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", sc}}}}}}), 400,
                    "response_format.json_schema.schema", "invalid_schema");
    expect_envelope(chat({{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", sc}}}}})},
                          {"tool_choice", "required"}}),
                    400, "tools", "invalid_schema");
    expect_envelope(raw_request(port, post_bytes("/v1/responses", json({{"input", "x"}, {"max_output_tokens", 4},
                                                                        {"text", {{"format", {{"type", "json_schema"}, {"name", "x"}, {"schema", sc}}}}}})
                                                                     .dump())),
                    400, "text.format.schema", "invalid_schema");
    json b = messages;
    b["tools"] = json::array({{{"name", "f"}, {"input_schema", sc}}});
    b["tool_choice"] = {{"type", "any"}};
    RawReply r = raw_request(port, post_bytes("/v1/messages", b.dump()));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(parsed(r)["error"]["message"].get<std::string>().rfind("tools.0.input_schema:", 0), 0u) << r.body;
  }

  std::string deep = std::string(70, '[') + std::string(70, ']');
  RawReply r = raw_request(port, post_bytes("/v1/chat/completions", R"({"metadata":)" + deep + "}"));
  expect_envelope(r, 400, nullptr, "limit_exceeded");
  EXPECT_EQ(parsed(r)["error"]["param"].get<std::string>().rfind("metadata[0][0]", 0), 0u) << r.body;

  ServerOptions so;
  so.limits.json.array_items = 10;
  so.limits.json.string_bytes = 100;
  auto srv = small_server(so);
  expect_envelope(raw_request(srv->port(), post_bytes("/v1/completions", R"({"prompt":[1,2,3,4,5,6,7,8,9,10,11]})")), 400, "prompt",
                  "limit_exceeded");
  expect_envelope(raw_request(srv->port(), post_bytes("/v1/completions", R"({"prompt":")" + std::string(101, 'a') + "\"}")), 400,
                  "prompt", "limit_exceeded");
}

TEST(Hostile, TimingsReportWhatTheClientReceives) {
  NEED_DEMO();
  const int port = demo->port();
  // Two streams share the two slots, so each one's own model steps are about half of its wall time.
  struct Seen {
    double first = -1, last = -1;
    json timings;
    int chunks = 0;
  };
  Seen seen[2];
  std::vector<std::thread> th;
  for (int i = 0; i < 2; ++i)
    th.emplace_back([&, i] {
      auto t0 = Clock::now();
      json b = json::parse(chat_json(i ? "Tell me about rivers." : "Tell me about mountains.", 40, ",\"stream\":true,\"cache_prompt\":false"));
      post_sse(port, "/v1/chat/completions", b, [&](const SseResult& r) {
        double t = since_ms(t0);
        if (!r.events.empty()) {
          auto& e = r.events.back();
          if (e.contains("timings")) seen[i].timings = e["timings"];
          else if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content") && !e["choices"][0]["delta"]["content"].get<std::string>().empty()) {
            if (seen[i].first < 0) seen[i].first = t;
            seen[i].last = t;
            ++seen[i].chunks;
          }
        }
        return true;
      });
    });
  for (auto& t : th) t.join();
  for (auto& s : seen) {
    ASSERT_TRUE(s.timings.is_object());
    if (s.chunks < 10) GTEST_SKIP() << "the random model stopped early";
    double client_span = s.last - s.first, predicted = s.timings["predicted_ms"];
    EXPECT_GT(predicted, 0.75 * client_span) << "timings report model-step time, not what the client saw";
    EXPECT_LT(predicted, 1.25 * client_span + 50);
    int n = s.timings["predicted_n"];
    EXPECT_NEAR(s.timings["predicted_per_second"].get<double>(), (n - 1) * 1e3 / predicted, 1e-6 * n + 1e-3);
  }
  EXPECT_GT(metric(port, "lily_response_decode_seconds_total"), 0);
}

}  // namespace
}  // namespace lily::server::test
