// The transport against hostile clients, over raw sockets where a client library would refuse the
// request: broken framing, bodies past the limit in every coding, idle and slow connections, the key
// before the body, browser-driven requests, a second server on the port, handlers that throw.
#include <brotli/encode.h>
#include <zlib.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "hostile_fixture.h"
#include "serve_process.h"

namespace lily::server::test {
namespace {

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

// A forked child (between fork and exec) holds copies of the server's descriptors, so closing a
// connection does not by itself take it out of the epoll set: its events must not reach the freed
// connection (ASan runs this in CI).
TEST(Hostile, ClosedConnectionsLeaveTheEventSetWhileAForkHoldsThem) {
  auto srv = small_server(ServerOptions{});
  const int port = srv->port();
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) {
    int fd = connect_port(port);
    ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
    EXPECT_EQ(read_reply(fd, 3000).status, 200);
    fds.push_back(fd);
  }
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::usleep(800 * 1000);  // async-signal-safe only: this is a copy of a threaded process
    ::_exit(0);
  }
  // shutdown() reaches the peer although the child holds the client ends too.
  for (int fd : fds) ::shutdown(fd, SHUT_RDWR);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_TRUE(healthy(port));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  for (int fd : fds) ::close(fd);
  EXPECT_TRUE(healthy(port));
}

}  // namespace
}  // namespace lily::server::test
