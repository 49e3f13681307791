// The golden models behind the server: token-id prompts through /v1/completions must give the
// reference greedy continuation. Also API keys (401) and a full queue (503).
#include <fstream>

#include "raw_http.h"
#include "server_fixture.h"

namespace lily::server::test {
namespace {

json golden(const std::string& name) {
  std::ifstream f(golden_dir(name) + "/golden.json");
  return json::parse(f);
}

std::unique_ptr<Running> golden_server(const std::string& name, ServerOptions so = {}, int64_t ctx = 4096) {
  std::string dir = tokenizer_dir();
  std::shared_ptr<const text::Tokenizer> tok = dir.empty() ? nullptr : text::Tokenizer::load(dir);
  so.model_id = name;
  return start_server(ModelWeights::load(golden_dir(name)), tok, dir, so, ctx, 64);
}

class GoldenServer : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenServer, GreedyContinuationMatchesReference) {
  auto g = golden(GetParam());
  auto srv = golden_server(GetParam());
  std::vector<int> prompt(g["prompt_ids"].begin(), g["prompt_ids"].begin() + g["greedy_prompt_len"].get<int>());
  auto want = g["greedy_ids"];
  json body = {{"model", GetParam()}, {"prompt", prompt}, {"max_tokens", want.size()}, {"temperature", 0}, {"return_tokens", true}};
  int st = 0;
  json r = post_json(srv->port(), "/v1/completions", body, &st);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["tokens"], want);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
  // Again, now from the prompt cache: same tokens, nothing prefilled.
  json again = post_json(srv->port(), "/v1/completions", body);
  EXPECT_EQ(again["choices"][0]["tokens"], want);
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt.size());
  // A longer prompt that starts with the cached one prefills only the rest.
  std::vector<int> longer(g["prompt_ids"].begin(), g["prompt_ids"].begin() + 100);
  json b2 = {{"prompt", longer}, {"max_tokens", 4}, {"temperature", 0}, {"return_tokens", true}};
  json cached = post_json(srv->port(), "/v1/completions", b2);
  b2["cache_prompt"] = false;
  json cold = post_json(srv->port(), "/v1/completions", b2);
  EXPECT_EQ(cached["choices"][0]["tokens"], cold["choices"][0]["tokens"]);
  EXPECT_GE(cached["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>(), prompt.size());
  EXPECT_EQ(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // Streaming gives the same text.
  body["stream"] = true;
  auto s = post_sse(srv->port(), "/v1/completions", body);
  std::string text;
  for (auto& e : s.events) text += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, r["choices"][0]["text"]);
  // Chat prompts from the Qwen3 tokenizer do not fit a 320-token vocabulary: a clear 400.
  if (!tokenizer_dir().empty()) {
    json c = post_json(srv->port(), "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}, &st);
    EXPECT_EQ(st, 400);
    EXPECT_NE(c["error"]["message"].get<std::string>().find("vocabulary"), std::string::npos) << c.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenServer, ::testing::Values("qwen3_5_moe_text-a", "qwen3_next-a"));

TEST(ServerAuth, ApiKeyRequired) {
  ServerOptions so;
  so.api_key = "sekret";
  auto srv = golden_server("qwen3_next-a", so);
  auto c = client(srv->port());
  json body = {{"prompt", {1, 2, 3}}, {"max_tokens", 2}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  auto j = json::parse(r->body);
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  r = c.Post("/v1/completions", {{"Authorization", "Bearer wrong"}}, body.dump(), "application/json");
  EXPECT_EQ(r->status, 401);
  r = c.Get("/v1/models");
  EXPECT_EQ(r->status, 401);
  r = c.Post("/v1/completions", {{"Authorization", "Bearer sekret"}}, body.dump(), "application/json");
  EXPECT_EQ(r->status, 200) << r->body;
  r = c.Get("/health");
  EXPECT_EQ(r->status, 200);
}

TEST(ServerAuth, AnthropicRoutesTakeXApiKeyAndAnswerInTheirEnvelope) {
  ServerOptions so;
  so.api_key = "sekret";
  auto srv = golden_server("qwen3_next-a", so);
  auto c = client(srv->port());
  json body = {{"model", "m"}, {"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto r = c.Post("/v1/messages", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  json j = json::parse(r->body);
  EXPECT_EQ(j["type"], "error") << r->body;
  EXPECT_EQ(j["error"]["type"], "authentication_error") << r->body;
  r = c.Post("/v1/messages", {{"x-api-key", "wrong"}}, body.dump(), "application/json");
  EXPECT_EQ(r->status, 401);
  r = c.Post("/v1/messages", {{"x-api-key", "sekret"}, {"anthropic-version", "2023-06-01"}}, body.dump(), "application/json");
  EXPECT_NE(r->status, 401) << r->body;  // past the key: this model has no tokenizer, a 400 in Anthropic's envelope
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "invalid_request_error") << r->body;
}

TEST(ServerQueue, FullQueueGives503WithRetryAfter) {
  ServerOptions so;
  so.sched.parallel = 1;
  so.sched.max_queue = 1;
  auto srv = golden_server("qwen3_next-a", so, 1 << 17);
  const int port = srv->port();
  // Two long streams: one in the slot, one queued. Each holds its place until we hang up.
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> th;
  for (int i = 0; i < 2; ++i)
    th.emplace_back([&, i] {
      json b = {{"prompt", {1, 2, 3, i}}, {"max_tokens", 120000}, {"stream", true}, {"temperature", 1}};
      bool counted = false;
      post_sse(port, "/v1/completions", b, [&](const SseResult& r) {
        if (!counted && r.status == 200) {
          counted = true;
          ++started;
        }
        return !release.load();
      });
      if (!counted) ++started;
    });
  for (int i = 0; i < 400 && metric(port, "lily_requests_active") + metric(port, "lily_queue_depth") < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto c = client(port);
  auto r = c.Post("/v1/completions", json{{"prompt", {5, 6}}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_TRUE(r->has_header("Retry-After"));
  EXPECT_GE(std::stoi(r->get_header_value("Retry-After")), 1);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "server_busy");
  release = true;
  for (auto& t : th) t.join();
  // Once they are gone the server takes requests again.
  for (int i = 0; i < 200 && metric(port, "lily_requests_active") > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  r = c.Post("/v1/completions", json{{"prompt", {5, 6}}, {"max_tokens", 2}}.dump(), "application/json");
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST(ServerQueue, ClientLeavingAStreamThatWritesNothingFreesItsSlot) {
  // Without a tokenizer the tokens have no text: after its head the stream writes nothing while events
  // flow, so only polling the socket can tell that the client left.
  ServerOptions so;
  so.sched.parallel = 1;
  so.keepalive_ms = 60000;
  auto srv = start_server(ModelWeights::load(golden_dir("qwen3_next-a")), nullptr, "", so, 1 << 17, 64);
  const int port = srv->port();
  int fd = connect_port(port);
  ASSERT_GE(fd, 0);
  json b = {{"prompt", {1, 2, 3}}, {"max_tokens", 120000}, {"stream", true}};
  ASSERT_TRUE(send_all(fd, post_bytes("/v1/completions", b.dump())));
  for (int i = 0; i < 400 && metric(port, "lily_requests_active") < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(metric(port, "lily_requests_active"), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // tokens flowing, nothing written
  const double cancelled0 = metric(port, "lily_requests_cancelled_total");
  ::close(fd);
  for (int i = 0; i < 200 && metric(port, "lily_requests_active") > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(metric(port, "lily_requests_active"), 0) << "the stream kept its slot after its client left";
  EXPECT_GT(metric(port, "lily_requests_cancelled_total"), cancelled0);
  auto c = client(port);
  auto r = c.Post("/v1/completions", json{{"prompt", {5, 6}}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

}  // namespace
}  // namespace lily::server::test
