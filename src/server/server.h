// The HTTP server: the core (server/core.h) with every API registered on it, behind the transport
// (server/http_server.h). HTTP threads parse and answer requests; every model step runs on the
// Scheduler's thread.
#pragma once
#include <memory>
#include <string>
#include <thread>

#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "server/chat_format.h"
#include "server/core.h"
#include "server/http_server.h"
#include "text/tokenizer.h"

namespace lily::server {

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
  Core& core() { return *core_; }

 private:
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<Core> core_;
  std::unique_ptr<HttpServer> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace lily::server
