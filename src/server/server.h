// The OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models, /health,
// /metrics, /tokenize, /detokenize and the chat page at /. HTTP threads parse and answer requests;
// every model step runs on the Scheduler's thread.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/engine.h"
#include "server/chat_format.h"
#include "runtime/scheduler.h"
#include "text/tokenizer.h"

namespace httplib {
class Server;
}

namespace lily::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port
  std::string api_key;             // empty: no authentication
  std::string model_id = "lily";
  std::string web_dir;             // chat page files; empty: searched next to the executable
  size_t max_body_bytes = size_t(8) << 20;  // larger bodies get 413
  int keepalive_ms = 2000;         // SSE comment after this much silence
  int64_t default_max_tokens = 4096;
  SchedulerOptions sched;
};

class Server {
 public:
  // `tok` and `chat` may be null: then only token-id prompts (/v1/completions) are served.
  Server(Engine& engine, std::shared_ptr<const text::Tokenizer> tok, std::shared_ptr<const ChatFormat> chat,
         ServerOptions opt);
  ~Server();

  // Binds host:port (port 0 picks a free one) and returns the port; throws InputError when it cannot.
  int bind();
  void listen();   // serves until stop(); bind() first
  void start();    // bind() + listen() on a background thread
  void stop();
  int port() const { return port_; }
  Scheduler& scheduler() { return *sched_; }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace lily::server
