// Shared by the hostile-client tests (hostile_*_test.cpp): a small golden-model server, the error
// envelope check, a health probe and a chat body.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "raw_http.h"
#include "server_fixture.h"

namespace lily::server::test {

using Clock = std::chrono::steady_clock;

// Time bounds stretch under ASan + UBSan (the quadratic cases they guard against are 20-50x slower).
#ifdef LILY_SANITIZED
constexpr double kSlowdown = 8;
#else
constexpr double kSlowdown = 1;
#endif

inline double since_ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// A small server over a golden model (token-id prompts only) with the given options.
inline std::unique_ptr<Running> small_server(ServerOptions so, int64_t ctx = 4096, const std::function<void(Server&)>& before = {}) {
  so.model_id = "small";
  return start_server(ModelWeights::load(golden_dir("qwen3_next-a")), nullptr, "", so, ctx, 64, before);
}

inline json parsed(const RawReply& r) { return json::parse(r.body, nullptr, false); }

// An error envelope with `status`, naming `param` when given.
inline void expect_envelope(const RawReply& r, int status, const char* param = nullptr, const char* code = nullptr) {
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

inline bool healthy(int port) {
  RawReply r = raw_request(port, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 3000);
  return r.status == 200;
}

inline std::string chat_json(const std::string& content, int max_tokens = 2, const std::string& extra = "") {
  return R"({"messages":[{"role":"user","content":)" + json(content).dump() + "}],\"max_tokens\":" + std::to_string(max_tokens) +
         ",\"temperature\":0" + extra + "}";
}

}  // namespace lily::server::test
