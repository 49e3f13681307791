// The real server on a loopback port, driven over HTTP (demo model with the real Qwen3 tokenizer).
#include <atomic>
#include <fstream>
#include <set>

#include "server_fixture.h"
#include "text/utf8.h"

namespace lily::server::test {
namespace {

json chat_body(const std::string& user, int max_tokens, json extra = json::object()) {
  json b = {{"model", "lily-demo"},
            {"messages", json::array({{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", user}}})},
            {"max_tokens", max_tokens},
            {"temperature", 0}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

TEST(ServerHttp, HealthModelsMetrics) {
  NEED_DEMO();
  auto c = client(demo->port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  auto mj = json::parse(m->body);
  EXPECT_EQ(mj["object"], "list");
  ASSERT_EQ(mj["data"].size(), 1u);
  EXPECT_EQ(mj["data"][0]["id"], "lily-demo");
  EXPECT_EQ(mj["data"][0]["object"], "model");
  auto one = c.Get("/v1/models/lily-demo");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  EXPECT_EQ(met->status, 200);
  for (const char* name : {"lily_requests_completed_total", "lily_prompt_tokens_total", "lily_generated_tokens_total",
                           "lily_prefill_tokens_per_second", "lily_decode_tokens_per_second", "lily_queue_depth",
                           "lily_prompt_cache_hits_total"})
    EXPECT_NE(met->body.find(std::string("# TYPE ") + name), std::string::npos) << name;
}

TEST(ServerHttp, ChatNonStreamingAndStreamingAgree) {
  NEED_DEMO();
  int st = 0;
  json r = post_json(demo->port(), "/v1/chat/completions", chat_body("Name three colours.", 12), &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["model"], "lily-demo");
  auto& ch = r["choices"][0];
  EXPECT_EQ(ch["message"]["role"], "assistant");
  ASSERT_TRUE(ch["message"]["content"].is_string());
  std::string text = ch["message"]["content"];
  std::string fr = ch["finish_reason"];
  EXPECT_TRUE(fr == "stop" || fr == "length") << fr;
  auto& u = r["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 10);
  EXPECT_GE(u["completion_tokens"].get<int>(), 1);
  EXPECT_LE(u["completion_tokens"].get<int>(), 12);
  EXPECT_EQ(u["total_tokens"].get<int>(), u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number_integer());
  // The prompt is the real template's rendering, tokenized by the real tokenizer.
  auto tk = post_json(demo->port(), "/tokenize",
                      {{"content", "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName three colours.<|im_end|>\n"
                                   "<|im_start|>assistant\n"}});
  EXPECT_EQ(tk["tokens"].size(), u["prompt_tokens"].get<size_t>());

  auto s = post_sse(demo->port(), "/v1/chat/completions",
                    chat_body("Name three colours.", 12, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(s.status, 200);
  ASSERT_TRUE(s.done);
  ASSERT_GE(s.events.size(), 3u);
  EXPECT_EQ(s.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(joined(s, "content"), text);
  // Last chunk: usage only; the one before it carries finish_reason.
  auto& last = s.events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], u["completion_tokens"]);
  EXPECT_EQ(last["usage"]["prompt_tokens"], u["prompt_tokens"]);
  EXPECT_EQ(s.events[s.events.size() - 2]["choices"][0]["finish_reason"], fr);
  for (size_t i = 0; i + 1 < s.events.size(); ++i) EXPECT_TRUE(s.events[i]["usage"].is_null());
}

TEST(ServerHttp, MaxTokensGivesLength) {
  NEED_DEMO();
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    json b = chat_body("Count to ten.", 1);
    b.erase("max_tokens");
    b[key] = 4;
    json r = post_json(demo->port(), "/v1/chat/completions", b);
    ASSERT_TRUE(r.contains("choices")) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length") << key;
    EXPECT_EQ(r["usage"]["completion_tokens"], 4) << key;
  }
}

// Token boundaries of a greedy answer, from its logprobs (each entry's bytes).
struct Answer {
  std::string text;
  std::string ids;
  std::vector<std::string> pieces;
};

Answer greedy_answer(int port, const std::string& user, int n) {
  json r = post_json(port, "/v1/chat/completions", chat_body(user, n, {{"logprobs", true}, {"return_tokens", true}}));
  Answer a;
  a.ids = r["choices"][0]["tokens"].dump();
  a.text = r["choices"][0]["message"]["content"];
  for (auto& e : r["choices"][0]["logprobs"]["content"]) {
    std::string b;
    for (auto& x : e["bytes"]) b.push_back(char(x.get<int>()));
    a.pieces.push_back(b);
  }
  return a;
}

TEST(ServerHttp, StopStringAcrossTokenBoundaries) {
  NEED_DEMO();
  Answer a = greedy_answer(demo->port(), "Tell me a story.", 40);
  ASSERT_GE(a.pieces.size(), 6u);
  std::string joined_pieces;
  for (auto& p : a.pieces) joined_pieces += p;
  // Random tokens can form ill-formed UTF-8 (shown as U+FFFD); use the well-formed start only.
  size_t valid = joined_pieces.size();
  while (valid > 0 && !text::utf8_valid(std::string_view(joined_pieces).substr(0, valid))) --valid;
  ASSERT_EQ(a.text.substr(0, valid), joined_pieces.substr(0, valid));
  // A stop string made of the end of one token and the start of the next.
  std::string stop;
  size_t at = 0, off = 0;
  for (size_t k = 0; k + 1 < a.pieces.size(); ++k) {
    off += a.pieces[k].size();
    const auto &p = a.pieces[k], &q = a.pieces[k + 1];
    if (k < 2 || p.size() < 2 || q.size() < 2 || off + 2 > valid) continue;
    std::string s = a.text.substr(off - 2, 4);
    if (text::utf8_valid(s) && a.text.find(s) == off - 2) {
      stop = s;
      at = off - 2;
      break;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no usable token boundary in: " << a.text << " (" << a.pieces.size() << " tokens: " << a.ids << ")";
  json b = chat_body("Tell me a story.", 40, {{"stop", json::array({"\x01never", stop})}});
  json r = post_json(demo->port(), "/v1/chat/completions", b);
  EXPECT_EQ(r["choices"][0]["message"]["content"], a.text.substr(0, at));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  b["stream"] = true;
  auto s = post_sse(demo->port(), "/v1/chat/completions", b);
  // Streamed pieces add up to the same prefix: no part of the stop string was sent.
  EXPECT_EQ(joined(s, "content"), a.text.substr(0, at));
  EXPECT_EQ(s.events.back()["choices"][0]["finish_reason"], "stop");
}

TEST(ServerHttp, LogprobsShape) {
  NEED_DEMO();
  json r = post_json(demo->port(), "/v1/chat/completions", chat_body("Hi", 6, {{"logprobs", true}, {"top_logprobs", 3}}));
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  auto& lp = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), r["usage"]["completion_tokens"].get<size_t>());
  std::string text;
  for (auto& e : lp) {
    ASSERT_TRUE(e["token"].is_string());
    ASSERT_TRUE(e["bytes"].is_array());
    float l = e["logprob"];
    EXPECT_LE(l, 0.0f);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<float>(), e["top_logprobs"][1]["logprob"].get<float>());
    EXPECT_GE(e["top_logprobs"][1]["logprob"].get<float>(), e["top_logprobs"][2]["logprob"].get<float>());
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
    EXPECT_NEAR(e["top_logprobs"][0]["logprob"].get<float>(), l, 1e-5);
    for (auto& x : e["bytes"]) text.push_back(char(x.get<int>()));
  }
  EXPECT_EQ(text::utf8_sanitize(text), r["choices"][0]["message"]["content"].get<std::string>());
  // Streaming carries the same entries, chunk by chunk.
  auto s = post_sse(demo->port(), "/v1/chat/completions",
                    chat_body("Hi", 6, {{"logprobs", true}, {"top_logprobs", 3}, {"stream", true}}));
  size_t n = 0;
  for (auto& e : s.events)
    if (!e["choices"].empty() && e["choices"][0]["logprobs"].is_object()) n += e["choices"][0]["logprobs"]["content"].size();
  EXPECT_EQ(n, lp.size());
}

TEST(ServerHttp, ConcurrentStreamsDoNotMix) {
  NEED_DEMO();
  const std::vector<std::string> prompts = {"First question about rivers.", "Second, about mountains.", "Third: deserts?"};
  std::vector<std::string> alone;
  for (auto& p : prompts) {
    json r = post_json(demo->port(), "/v1/chat/completions", chat_body(p, 16, {{"cache_prompt", false}}));
    alone.push_back(r["choices"][0]["message"]["content"]);
  }
  // Three at once on two slots (the third queues), each stream must carry exactly its own text.
  std::vector<std::string> together(prompts.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < prompts.size(); ++i)
    th.emplace_back([&, i] {
      auto s = post_sse(demo->port(), "/v1/chat/completions", chat_body(prompts[i], 16, {{"stream", true}, {"cache_prompt", false}}));
      together[i] = joined(s, "content");
    });
  for (auto& t : th) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i], alone[i]) << i;
}

TEST(ServerHttp, DisconnectStopsGeneration) {
  NEED_DEMO();
  const int port = demo->port();
  double cancelled0 = metric(port, "lily_requests_cancelled_total");
  double gen0 = metric(port, "lily_generated_tokens_total");
  int chunks = 0;
  auto s = post_sse(port, "/v1/chat/completions", chat_body("Go on forever.", 3000, {{"stream", true}, {"cache_prompt", false}}),
                    [&](const SseResult& r) { return ++chunks < 6; });
  EXPECT_FALSE(s.done);
  // The scheduler notices at its next write and frees the slot.
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    seen = metric(port, "lily_requests_cancelled_total") > cancelled0;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(seen);
  double gen = metric(port, "lily_generated_tokens_total") - gen0;
  EXPECT_LT(gen, 100) << "generation went on after the client left";
  EXPECT_EQ(metric(port, "lily_requests_active"), 0);
  // The slot is usable again.
  json r = post_json(port, "/v1/chat/completions", chat_body("Still there?", 2));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
}

TEST(ServerHttp, PromptCacheServesTheNextTurn) {
  NEED_DEMO();
  const int port = demo->port();
  json turn1 = chat_body("My name is Ada. Remember it.", 8);
  json r1 = post_json(port, "/v1/chat/completions", turn1);
  std::string reply = r1["choices"][0]["message"]["content"];
  json turn2 = turn1;
  turn2["messages"].push_back({{"role", "assistant"}, {"content", reply}});
  turn2["messages"].push_back({{"role", "user"}, {"content", "What is my name?"}});
  json cold = turn2;
  cold["cache_prompt"] = false;
  json without = post_json(port, "/v1/chat/completions", cold);
  json with = post_json(port, "/v1/chat/completions", turn2);
  ASSERT_TRUE(with.contains("usage")) << with.dump();
  int64_t prompt = with["usage"]["prompt_tokens"], cached = with["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_EQ(without["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GE(cached, r1["usage"]["prompt_tokens"].get<int64_t>()) << "turn 1's prompt should be reused";
  EXPECT_LT(cached, prompt);
  EXPECT_EQ(with["timings"]["prompt_n"].get<int64_t>(), prompt - cached);
  EXPECT_EQ(without["timings"]["prompt_n"].get<int64_t>(), prompt);
  EXPECT_EQ(with["choices"][0]["message"]["content"], without["choices"][0]["message"]["content"]);
  // The very same request again: everything but nothing is prefilled.
  json again = post_json(port, "/v1/chat/completions", turn2);
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt);
  EXPECT_EQ(again["choices"][0]["message"]["content"], without["choices"][0]["message"]["content"]);
}

TEST(ServerHttp, ErrorStatusesAndEnvelopes) {
  NEED_DEMO();
  const int port = demo->port();
  auto c = client(port);
  auto expect_error = [](const httplib::Result& res, int status, const char* param = nullptr) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    auto j = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << res->body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_TRUE(j["error"].contains("param"));
    EXPECT_TRUE(j["error"].contains("code"));
    if (param) {
      EXPECT_EQ(j["error"]["param"], param);
    }
  };
  expect_error(c.Post("/v1/chat/completions", "{not json", "application/json"), 400);
  expect_error(c.Post("/v1/chat/completions", "[1,2]", "application/json"), 400);
  expect_error(c.Post("/v1/chat/completions", chat_body("x", 2, {{"temperature", 7}}).dump(), "application/json"), 400, "temperature");
  expect_error(c.Post("/v1/chat/completions", chat_body("x", 2, {{"top_p", 0}}).dump(), "application/json"), 400, "top_p");
  expect_error(c.Post("/v1/chat/completions", chat_body("x", 2, {{"max_tokens", 0}}).dump(), "application/json"), 400, "max_tokens");
  expect_error(c.Post("/v1/chat/completions", chat_body("x", 2, {{"n", 3}}).dump(), "application/json"), 400, "n");
  expect_error(c.Post("/v1/chat/completions", json{{"messages", json::array()}}.dump(), "application/json"), 400, "messages");
  expect_error(c.Post("/v1/chat/completions", json{{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}.dump(), "application/json"), 400);
  expect_error(c.Post("/v1/chat/completions", chat_body("x", 2, {{"top_logprobs", 3}}).dump(), "application/json"), 400, "top_logprobs");
  expect_error(c.Post("/v1/completions", json{{"prompt", {1, 2, 99999999}}}.dump(), "application/json"), 400, "prompt");
  expect_error(c.Post("/v1/chat/completions", chat_body("x", 2, {{"model", "gpt-17"}}).dump(), "application/json"), 404, "model");
  expect_error(c.Get("/v1/nothing-here"), 404);
  expect_error(c.Get("/v1/models/gpt-17"), 404);
  std::string huge(2 << 20, 'a');
  expect_error(c.Post("/v1/chat/completions", chat_body(huge, 2).dump(), "application/json"), 413);
  // Context overflow is the client's error too.
  json longp = chat_body(std::string(30000, 'z') + " " + std::string(30000, 'q'), 2);
  auto lr = c.Post("/v1/chat/completions", longp.dump(), "application/json");
  expect_error(lr, 400, "messages");
  // None of that hurt the server.
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(ServerHttp, CompletionsTextIdsEchoLogprobs) {
  NEED_DEMO();
  const int port = demo->port();
  json r = post_json(port, "/v1/completions", {{"prompt", "The capital of France is"}, {"max_tokens", 5}, {"temperature", 0}});
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  std::string gen = r["choices"][0]["text"];
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
  auto ids = post_json(port, "/tokenize", {{"content", "The capital of France is"}})["tokens"];
  json r2 = post_json(port, "/v1/completions", {{"prompt", ids}, {"max_tokens", 5}, {"temperature", 0}});
  EXPECT_EQ(r2["choices"][0]["text"], gen);
  json r3 = post_json(port, "/v1/completions",
                      {{"prompt", "The capital of France is"}, {"max_tokens", 5}, {"temperature", 0}, {"echo", true}, {"logprobs", 2}});
  EXPECT_EQ(r3["choices"][0]["text"], "The capital of France is" + gen);
  auto& lp = r3["choices"][0]["logprobs"];
  size_t n = ids.size() + 5;
  ASSERT_EQ(lp["tokens"].size(), n);
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  ASSERT_EQ(lp["top_logprobs"].size(), n);
  ASSERT_EQ(lp["text_offset"].size(), n);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  for (size_t i = 1; i < n; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<float>(), 0.0f);
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    EXPECT_GE(lp["text_offset"][i].get<int>(), lp["text_offset"][i - 1].get<int>());
  }
  auto s = post_sse(port, "/v1/completions", {{"prompt", "The capital of France is"}, {"max_tokens", 5}, {"temperature", 0}, {"stream", true}});
  std::string st;
  for (auto& e : s.events) st += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(st, gen);
  EXPECT_TRUE(s.done);
}

TEST(ServerHttp, TokenizeDetokenizeRoundTrip) {
  NEED_DEMO();
  const std::string t = "Hello, wörld! 你好 <|im_end|>";
  auto ids = post_json(demo->port(), "/tokenize", {{"content", t}})["tokens"];
  ASSERT_GT(ids.size(), 3u);
  EXPECT_EQ(post_json(demo->port(), "/detokenize", {{"tokens", ids}})["content"], t);
  auto pieces = post_json(demo->port(), "/tokenize", {{"content", t}, {"with_pieces", true}})["tokens"];
  EXPECT_EQ(pieces.size(), ids.size());
  EXPECT_EQ(pieces.back()["piece"], "<|im_end|>");
}

TEST(ServerHttp, ToolsAndHistoryAreAccepted) {
  NEED_DEMO();
  json tools = json::array({{{"type", "function"},
                             {"function", {{"name", "get_weather"}, {"description", "Weather for a city"},
                                           {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}}});
  json b = {{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Weather in Paris?"}}})}},
                                      {{"role", "assistant"}, {"content", nullptr},
                                       {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                                                    {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}})}},
                                      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temp_c\": 21}"}},
                                      {{"role", "user"}, {"content", "And tomorrow?"}}})},
            {"tools", tools}, {"tool_choice", "auto"}, {"max_tokens", 3}, {"temperature", 0},
            {"chat_template_kwargs", {{"enable_thinking", false}}}};
  int st = 0;
  json r = post_json(demo->port(), "/v1/chat/completions", b, &st);
  EXPECT_EQ(st, 200) << r.dump();
  // The tool schema and the earlier call are in the prompt the model saw.
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), 100);
  b["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  post_json(demo->port(), "/v1/chat/completions", b, &st);
  EXPECT_EQ(st, 400);
}

}  // namespace
}  // namespace lily::server::test

namespace lily::server::test {
namespace {

TEST(ServerHttp, LongPrefillSendsSseComments) {
  NEED_DEMO();
  std::string longtext;
  for (int i = 0; i < 120; ++i) longtext += "The quick brown fox jumps over the lazy dog. ";
  auto s = post_sse(demo->port(), "/v1/chat/completions", chat_body(longtext, 2, {{"stream", true}, {"cache_prompt", false}}));
  ASSERT_EQ(s.status, 200);
  EXPECT_TRUE(s.done);
  // The prompt is absorbed 64 tokens per step; each step tells the client it is still alive.
  EXPECT_GE(s.comments, 10) << s.raw.substr(0, 400);
  EXPECT_NE(s.raw.find(": prefill "), std::string::npos);
  EXPECT_LT(s.raw.find(": prefill"), s.raw.find("\"finish_reason\":\"length\""));
}

}  // namespace
}  // namespace lily::server::test
