// The server against hostile clients, over raw sockets where a client library would refuse the
// request: invalid bytes anywhere, broken framing, bodies past the limit in every coding, idle and slow
// connections, out-of-range numbers, browser-driven requests, and a deadline per request.
#include <brotli/encode.h>
#include <zlib.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "raw_http.h"
#include "serve_process.h"
#include "server/json_body.h"
#include "server/openai_responses.h"
#include "server_fixture.h"

namespace lily::server::test {
namespace {

using Clock = std::chrono::steady_clock;

double since_ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// A small server over a golden model (token-id prompts only) with the given options.
std::unique_ptr<Running> small_server(ServerOptions so, int64_t ctx = 4096, const std::function<void(Server&)>& before = {}) {
  so.model_id = "small";
  return start_server(ModelWeights::load(golden_dir("qwen3_next-a")), nullptr, "", so, ctx, 64, before);
}

json parsed(const RawReply& r) { return json::parse(r.body, nullptr, false); }

// An error envelope with `status`, naming `param` when given.
void expect_envelope(const RawReply& r, int status, const char* param = nullptr, const char* code = nullptr) {
  EXPECT_EQ(r.status, status) << r.head << "\n" << r.body;
  json j = parsed(r);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  if (param) {
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  }
  if (code) {
    EXPECT_EQ(j["error"]["code"], code) << r.body;
  }
}

bool healthy(int port) {
  RawReply r = raw_request(port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 3000);
  return r.status == 200;
}

std::string chat_json(const std::string& content, int max_tokens = 2, const std::string& extra = "") {
  return R"({"messages":[{"role":"user","content":)" + json(content).dump() + "}],\"max_tokens\":" + std::to_string(max_tokens) +
         ",\"temperature\":0" + extra + "}";
}

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

TEST(Hostile, HandlerExceptionsNeverEscape) {
  auto srv = small_server({}, 4096, [](Server& s) {
    s.core().route("GET", "/throw/int", [](const HttpRequest&, HttpResponse&) { throw 42; });
    s.core().route("GET", "/throw/std", [](const HttpRequest&, HttpResponse&) { throw std::runtime_error("bad \xff byte"); });
    s.core().route("POST", "/throw/json", [](const HttpRequest& q, HttpResponse&) { (void)json::parse(q.body).at("x"); });
  });
  const int port = srv->port();
  for (const char* path : {"/throw/int", "/throw/std"}) {
    RawReply r = raw_request(port, fmt::format("GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path));
    expect_envelope(r, 500, nullptr, "internal_error");
  }
  expect_envelope(raw_request(port, post_bytes("/throw/json", "{}")), 500);
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

std::string gzip_bytes(const std::string& in, int window_bits) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, window_bits, 9, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, uLong(in.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string brotli_bytes(const std::string& in) {
  size_t n = BrotliEncoderMaxCompressedSize(in.size());
  std::string out(n, '\0');
  BrotliEncoderCompress(5, 22, BROTLI_MODE_GENERIC, in.size(), reinterpret_cast<const uint8_t*>(in.data()), &n,
                        reinterpret_cast<uint8_t*>(out.data()));
  out.resize(n);
  return out;
}

TEST(Hostile, BodyLimitHoldsWhateverTheFraming) {
  NEED_DEMO();  // 1 MiB bodies
  const int port = demo->port();
  const std::string big = chat_json(std::string(3 << 20, 'a'));
  // Chunked: counted as it arrives.
  std::string chunked = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n";
  for (size_t i = 0; i < big.size(); i += 65536) {
    std::string part = big.substr(i, 65536);
    chunked += fmt::format("{:x}\r\n", part.size()) + part + "\r\n";
  }
  chunked += "0\r\n\r\n";
  expect_envelope(raw_request(port, chunked), 413, nullptr, "request_too_large");
  // Compressed: a few kB that inflate past the limit stop at the limit.
  struct Coding {
    const char* name;
    std::string bytes;
  };
  for (const Coding& c : {Coding{"gzip", gzip_bytes(big, 31)}, Coding{"deflate", gzip_bytes(big, 15)},
                          Coding{"deflate", gzip_bytes(big, -15)}, Coding{"br", brotli_bytes(big)}}) {
    ASSERT_LT(c.bytes.size(), 64u << 10) << c.name;
    auto t0 = Clock::now();
    RawReply r = raw_request(port, post_bytes("/v1/chat/completions", c.bytes, fmt::format("Content-Encoding: {}\r\n", c.name)));
    expect_envelope(r, 413, nullptr, "request_too_large");
    EXPECT_LT(since_ms(t0), 3000) << c.name;
  }
  // A compressed body within the limit is decoded and served.
  const std::string ok = chat_json("Hello there", 2);
  for (const Coding& c : {Coding{"gzip", gzip_bytes(ok, 31)}, Coding{"deflate", gzip_bytes(ok, 15)}, Coding{"br", brotli_bytes(ok)}}) {
    RawReply r = raw_request(port, post_bytes("/v1/chat/completions", c.bytes, fmt::format("Content-Encoding: {}\r\n", c.name)));
    EXPECT_EQ(r.status, 200) << c.name << " " << r.body;
  }
  expect_envelope(raw_request(port, post_bytes("/v1/chat/completions", "garbage", "Content-Encoding: gzip\r\n")), 400);
  expect_envelope(raw_request(port, post_bytes("/v1/chat/completions", ok, "Content-Encoding: zstd\r\n")), 415);
  // A declared length past the limit is refused before any of the body is sent.
  auto t0 = Clock::now();
  RawReply r = raw_request(port, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                 "Content-Length: 5000000\r\n\r\n");
  expect_envelope(r, 413);
  EXPECT_LT(since_ms(t0), 2000);
  EXPECT_TRUE(healthy(port));
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
  EXPECT_LT(ms, 1500) << "100k-key object";
  // Inside a string too: a Responses function_call's arguments are parsed the same way.
  json input = json::array({{{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", obj}},
                            {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "ok"}}});
  RequestLimits rl;
  rl.json.object_keys = 200000;
  t0 = Clock::now();
  ResponsesRequest rr = parse_responses_request(json{{"input", input}}, rl);
  EXPECT_LT(since_ms(t0), 1500) << "100k-key function_call arguments";
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
  EXPECT_LT(since_ms(t0), 3000);
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

TEST(Hostile, IdleAndSlowConnectionsDoNotStarveTheServer) {
  NEED_DEMO();
  const int port = demo->port();
  std::vector<int> fds;
  // More idle connections than worker threads, half-sent heads, half-sent bodies.
  for (int i = 0; i < 40; ++i) fds.push_back(connect_port(port));
  for (int i = 0; i < 20; ++i) {
    int fd = connect_port(port);
    send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    fds.push_back(fd);
  }
  for (int i = 0; i < 20; ++i) {
    int fd = connect_port(port);
    send_all(fd, post_bytes("/v1/chat/completions", chat_json("hi")).substr(0, 150));
    fds.push_back(fd);
  }
  auto t0 = Clock::now();
  EXPECT_TRUE(healthy(port));
  EXPECT_LT(since_ms(t0), 1000);
  int st = 0;
  post_json(port, "/v1/chat/completions", json::parse(chat_json("Still served?")), &st);
  EXPECT_EQ(st, 200);
  for (int fd : fds) ::close(fd);

  // A request that does not arrive in time gets 408; connections past the cap get 503 at once.
  ServerOptions so;
  so.read_timeout_s = 1;
  so.max_connections = 8;
  auto srv = small_server(so);
  int slow = connect_port(srv->port());
  send_all(slow, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  t0 = Clock::now();
  RawReply r = read_reply(slow, 5000);
  expect_envelope(r, 408);
  EXPECT_LT(since_ms(t0), 3000);
  ::close(slow);
  std::vector<int> held;
  for (int i = 0; i < 8; ++i) held.push_back(connect_port(srv->port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  r = raw_request(srv->port(), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 3000);
  expect_envelope(r, 503, nullptr, "server_busy");
  for (int fd : held) ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(healthy(srv->port()));
}

TEST(Hostile, ApiKeyIsCheckedBeforeTheBody) {
  ServerOptions so;
  so.api_key = "sekret";
  auto srv = small_server(so);
  auto t0 = Clock::now();
  RawReply r = raw_request(srv->port(), "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                        "Content-Length: 500000\r\n\r\n{\"prompt\":");
  expect_envelope(r, 401, nullptr, "invalid_api_key");
  EXPECT_LT(since_ms(t0), 2000);
  // A key that shares a prefix with the real one, or is longer, is still wrong.
  for (const char* k : {"sekre", "sekret2", "Sekret", ""}) {
    r = raw_request(srv->port(), post_bytes("/v1/completions", R"({"prompt":[1],"max_tokens":1})", fmt::format("Authorization: Bearer {}\r\n", k)));
    EXPECT_EQ(r.status, 401) << k;
  }
  r = raw_request(srv->port(), post_bytes("/v1/completions", R"({"prompt":[1],"max_tokens":1})", "x-api-key: sekret\r\n"));
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(Hostile, SecondServerOnThePortFails) {
  NEED_DEMO();
  ServerOptions so;
  so.port = demo->port();
  auto engine = Engine::from_weights(ModelWeights::load(golden_dir("qwen3_next-a")), EngineOptions{"cpu", 256, 64});
  Server second(*engine, nullptr, nullptr, so);
  try {
    second.bind();
    FAIL() << "a second server bound the same port";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("already in use"), std::string::npos) << e.what();
  }
  // The binary says so and exits with 2.
  const std::string lily = lily_binary();
  if (!std::filesystem::exists(lily)) GTEST_SKIP() << "no lily binary";
  std::string out;
  int rc = run_command(fmt::format("'{}' serve --model '{}' --port {}", lily, golden_dir("qwen3_next-a"), demo->port()), out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("error: cannot listen on 127.0.0.1:"), std::string::npos) << out;
  EXPECT_TRUE(healthy(demo->port()));
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
  };
  for (auto& c : cases) {
    RawReply r = raw_request(port, post_bytes("/v1/chat/completions", chat_json("x", 2, c.extra)));
    expect_envelope(r, 400, c.param.c_str());
  }
  for (const char* bad : {R"({"temperature":NaN})", R"({"temperature":Infinity})", R"({"temperature":-Infinity})", "{\"a\":\"\x01\"}"}) {
    RawReply r = raw_request(port, post_bytes("/v1/chat/completions", bad));
    expect_envelope(r, 400, nullptr, "invalid_json");
  }
  RawReply r = raw_request(port, post_bytes("/v1/completions", R"({"prompt":[1,2,1e400]})"));
  expect_envelope(r, 400, "prompt[2]");
  r = raw_request(port, post_bytes("/v1/completions", R"({"prompt":[1,2,18446744073709551615]})"));
  expect_envelope(r, 400, "prompt");
  EXPECT_TRUE(healthy(port));
}

TEST(Hostile, BrowserSafety) {
  NEED_DEMO();
  const int port = demo->port();
  const std::string body = chat_json("hi");
  // No CORS by default: a cross-origin page gets no permission to read, and its preflight is not approved.
  RawReply r = raw_request(port, post_bytes("/v1/chat/completions", body, "Origin: http://evil.example\r\n"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("Access-Control-Allow-Origin"), "");
  r = raw_request(port, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://evil.example\r\n"
                        "Access-Control-Request-Method: POST\r\n\r\n");
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.header("Access-Control-Allow-Origin"), "");
  // Bodies a page can send without a preflight are refused.
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"})
    expect_envelope(raw_request(port, post_bytes("/v1/chat/completions", body, "", type)), 415, nullptr, "unsupported_media_type");
  expect_envelope(raw_request(port, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
                                        std::to_string(body.size()) + "\r\n\r\n" + body),
                  415);
  EXPECT_EQ(raw_request(port, post_bytes("/v1/chat/completions", body, "", "Application/JSON; charset=utf-8")).status, 200);
  // A keyless server answers its addresses and localhost, not other names (DNS rebinding).
  auto with_host = [&](const std::string& host) {
    return raw_request(port, "GET /v1/models HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n").status;
  };
  EXPECT_EQ(with_host("evil.example"), 403);
  EXPECT_EQ(with_host("evil.example:" + std::to_string(port)), 403);
  EXPECT_EQ(with_host("127.0.0.1.evil.example"), 403);
  EXPECT_EQ(with_host("127.0.0.1:" + std::to_string(port)), 200);
  EXPECT_EQ(with_host("localhost:" + std::to_string(port)), 200);
  EXPECT_EQ(with_host("[::1]:" + std::to_string(port)), 200);
  EXPECT_EQ(with_host("10.1.2.3"), 200);

  // Allowed origins get CORS; a server with a key accepts any Host.
  ServerOptions so;
  so.cors_origins = {"http://ok.example"};
  so.allowed_hosts = {"lily.internal"};
  auto srv = small_server(so);
  const std::string cbody = R"({"prompt":[1],"max_tokens":1})";
  r = raw_request(srv->port(), post_bytes("/v1/completions", cbody, "Origin: http://ok.example\r\n"));
  EXPECT_EQ(r.header("Access-Control-Allow-Origin"), "http://ok.example");
  r = raw_request(srv->port(), post_bytes("/v1/completions", cbody, "Origin: http://ok.example.evil\r\n"));
  EXPECT_EQ(r.header("Access-Control-Allow-Origin"), "");
  r = raw_request(srv->port(), "OPTIONS /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://ok.example\r\n\r\n");
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.header("Access-Control-Allow-Origin"), "http://ok.example");
  EXPECT_NE(r.header("Access-Control-Allow-Headers").find("Content-Type"), std::string::npos);
  EXPECT_EQ(raw_request(srv->port(), "GET /health HTTP/1.1\r\nHost: lily.internal:99\r\nConnection: close\r\n\r\n").status, 200);
  ServerOptions keyed;
  keyed.api_key = "k";
  auto ksrv = small_server(keyed);
  r = raw_request(ksrv->port(), "GET /v1/models HTTP/1.1\r\nHost: anything.example\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.status, 200);
}

TEST(Hostile, FramingIsAnsweredAtOnce) {
  NEED_DEMO();
  const int port = demo->port();
  auto timed = [&](const std::string& req, int status) {
    auto t0 = Clock::now();
    RawReply r = raw_request(port, req, 5000);
    EXPECT_FALSE(r.timed_out) << req.substr(0, 60);
    expect_envelope(r, status);
    EXPECT_LT(since_ms(t0), 2000) << req.substr(0, 60);
  };
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  timed(head + "Content-Length: -1\r\n\r\n", 400);
  timed(head + "Content-Length: 99999999999999999999\r\n\r\n", 400);
  timed(head + "Content-Length: 99999999999999\r\n\r\n", 413);
  timed(head + "Content-Length: 12abc\r\n\r\n", 400);
  timed(head + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n", 400);
  timed(head + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400);
  timed(head + "Transfer-Encoding: gzip\r\n\r\n", 400);
  timed(head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400);
  timed("PUT /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404);
  timed("PATCH /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404);
  timed("DELETE /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 404);
  timed("GET / HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n", 400);
  timed("GET /health HTTP/1.1\r\n\r\n", 400);  // HTTP/1.1 needs a Host
  timed("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n Folded: x\r\n\r\n", 400);
  timed("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header: x\r\n\r\n", 400);
  timed("GARBAGE\r\n\r\n", 400);
  timed("GET /" + std::string(20000, 'a') + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 431);
  timed("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n", 431);
  EXPECT_TRUE(healthy(port));
}

TEST(Hostile, KeepAlivePipeliningHeadAndContinue) {
  NEED_DEMO();
  const int port = demo->port();
  // Two requests in one write, answered in order on one connection.
  int fd = connect_port(port);
  std::string two = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_TRUE(send_all(fd, two));
  std::string carry;
  RawReply a = read_reply(fd, 3000, Clock::now(), &carry);
  RawReply b = read_reply(fd, 3000, Clock::now(), &carry);
  EXPECT_EQ(a.status, 200);
  EXPECT_NE(a.body.find("\"status\""), std::string::npos);
  EXPECT_EQ(b.status, 200);
  EXPECT_NE(b.body.find("lily-demo"), std::string::npos);
  ::close(fd);
  // HTTP/1.0 without Host; HEAD has the headers only.
  RawReply r = raw_request(port, "GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  r = raw_request(port, "HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body.empty());
  // Expect: 100-continue gets the interim answer, then the reply.
  fd = connect_port(port);
  const std::string body = chat_json("hi", 1);
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
               "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n");
  char buf[64] = {};
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 3000), 1);
  ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u) << buf;
  send_all(fd, body);
  r = read_reply(fd, 10000);
  EXPECT_EQ(r.status, 200) << r.body;
  ::close(fd);
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
