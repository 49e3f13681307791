// Shared helpers for the server tests: in-process servers on free loopback ports (the demo model with
// the real Qwen3 tokenizer, and the golden models), plus small HTTP/SSE client helpers.
#pragma once
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "runtime/demo_model.h"
#include "runtime/engine.h"
#include "server/server.h"
#include "text/tokenizer.h"

namespace lily::server::test {

using json = nlohmann::ordered_json;

struct Running {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<const text::Tokenizer> tok;
  std::unique_ptr<Server> server;
  int port() const { return server->port(); }
};

inline std::string tokenizer_dir() { return find_demo_tokenizer_dir(); }

// A server on `engine` (its context size: ctx) with the chat template of `tok_dir`, or `template_file`.
inline std::unique_ptr<Running> start_server_on(std::unique_ptr<Engine> engine, std::shared_ptr<const text::Tokenizer> tok,
                                                const std::string& tok_dir, ServerOptions so, int64_t ctx,
                                                const std::string& template_file = "",
                                                const std::function<void(Server&)>& before_start = {}) {
  auto r = std::make_unique<Running>();
  r->engine = std::move(engine);
  r->tok = tok;
  so.host = "127.0.0.1";
  so.port = 0;
  so.sched.ctx_size = ctx;
  auto chat = tok ? load_chat_format(tok_dir, template_file) : nullptr;
  r->server = std::make_unique<Server>(*r->engine, tok, chat, so);
  if (before_start) before_start(*r->server);
  r->server->start();
  return r;
}

// `before_start` may add routes to the server's core.
inline std::unique_ptr<Running> start_server(std::shared_ptr<const ModelWeights> w,
                                             std::shared_ptr<const text::Tokenizer> tok,
                                             const std::string& tok_dir, ServerOptions so, int64_t ctx = 4096,
                                             int64_t prefill_chunk = 64,
                                             const std::function<void(Server&)>& before_start = {}) {
  return start_server_on(Engine::from_weights(std::move(w), EngineOptions{"cpu", ctx, prefill_chunk}), std::move(tok), tok_dir,
                         std::move(so), ctx, "", before_start);
}

// The demo model with the real Qwen3 tokenizer: 2 slots, a queue of 2, 1 MiB bodies. Shared by tests.
inline Running* demo_server() {
  static std::unique_ptr<Running> r = [] {
    std::unique_ptr<Running> out;
    std::string dir = tokenizer_dir();
    if (dir.empty()) return out;
    auto tok = text::Tokenizer::load(dir);
    DemoModelOptions d;
    d.vocab = tok->vocab_size();
    ServerOptions so;
    so.model_id = "lily-demo";
    so.max_body_bytes = 1 << 20;
    so.keepalive_ms = 200;
    so.sched.parallel = 2;
    so.sched.max_queue = 2;
    return start_server(make_demo_weights(d), tok, dir, so);
  }();
  return r.get();
}

#define NEED_DEMO()                                                                         \
  auto* demo = demo_server();                                                               \
  if (!demo) GTEST_SKIP() << "Qwen3 tokenizer not fetched (scripts/fetch-assets.sh)";

inline std::string golden_dir(const std::string& name) { return std::string(LILY_TEST_DATA) + "/golden/" + name; }

inline httplib::Client client(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60);
  c.set_connection_timeout(5);
  return c;
}

inline json post_json(int port, const std::string& path, const json& body, int* status = nullptr,
                      httplib::Headers headers = {}) {
  auto c = client(port);
  auto res = c.Post(path.c_str(), headers, body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response from " << path;
    return json();
  }
  if (status) *status = res->status;
  return json::parse(res->body, nullptr, false);
}

struct SseResult {
  int status = 0;
  std::vector<json> events;  // parsed data: payloads, [DONE] excluded
  int comments = 0;
  bool done = false;         // saw data: [DONE]
  std::string raw;
};

// Streams a POST; `keep_going(events so far)` may return false to hang up mid-stream.
inline SseResult post_sse(int port, const std::string& path, const json& body,
                          std::function<bool(const SseResult&)> keep_going = {}) {
  SseResult out;
  auto c = client(port);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buf;
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    out.raw.append(data, n);
    buf.append(data, n);
    size_t i;
    while ((i = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, i);
      buf.erase(0, i + 2);
      if (ev.rfind(":", 0) == 0) {
        ++out.comments;
      } else if (ev.rfind("data: ", 0) == 0) {
        std::string d = ev.substr(6);
        if (d == "[DONE]") out.done = true;
        else out.events.push_back(json::parse(d, nullptr, false));
      }
    }
    return !keep_going || keep_going(out);
  };
  c.send(req);
  return out;
}

// Concatenated delta fields of a chat stream.
inline std::string joined(const SseResult& r, const char* key) {
  std::string s;
  for (auto& e : r.events)
    if (e.contains("choices") && !e["choices"].empty()) {
      auto& d = e["choices"][0]["delta"];
      if (d.contains(key) && d[key].is_string()) s += d[key].get<std::string>();
    }
  return s;
}

inline double metric(int port, const std::string& name) {
  auto c = client(port);
  auto res = c.Get("/metrics");
  if (!res) return -1;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

}  // namespace lily::server::test
