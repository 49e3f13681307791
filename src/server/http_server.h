// The HTTP/1.1 transport under the core. One I/O thread owns every connection while a request is
// being read (epoll, non-blocking sockets), so idle and slow clients cost no worker: each request has
// a deadline from its first byte to its last, idle keep-alive connections are closed after a while,
// and connections beyond a cap are refused at once. A complete request goes to a worker thread, which
// runs the core's handler and writes the response (streamed bodies chunked); routes marked quick
// (/health) are answered on the I/O thread itself, so they are answered however busy the workers are.
// The listening socket is exclusive (no SO_REUSEPORT): a second server on the port fails to bind.
#pragma once
#include <atomic>
#include <condition_variable>
#include <optional>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/core.h"
#include "server/http_wire.h"

namespace lily::server {

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port
  int workers = 16;              // threads running handlers
  int max_connections = 512;     // open connections; more are answered 503 and closed
  int read_timeout_ms = 30000;   // one request, from its first byte to the end of its body (408 after)
  int idle_timeout_ms = 15000;   // a keep-alive connection waiting for its next request
  int write_timeout_ms = 30000;  // a response write making no progress
  size_t body_bytes = size_t(8) << 20;
  WireLimits wire;
};

class HttpServer {
 public:
  HttpServer(Core& core, TransportOptions opt);
  ~HttpServer();

  // Binds and listens; returns the port. InputError naming the address when it cannot (in use, ...).
  int bind();
  void run();   // serves until stop(); bind() first
  void stop();  // from any thread; run() returns once in-flight handlers have finished
  bool running() const { return running_.load(); }

  struct Conn;

 private:
  struct Task {
    Conn* conn;
    HttpRequest req;
    bool head_only;
  };
  struct Worker;
  void loop();
  void worker(Worker& w);
  void accept_all();
  void on_readable(Conn& c);
  void process(Conn& c);
  void reply(Conn& c, HttpResponse& res, bool head_only, bool close);
  void refuse(Conn& c, int status, const std::string& message);
  void flush(Conn& c);
  void close_conn(Conn& c);
  void rearm(Conn& c, uint32_t events);
  void expire(int64_t now);
  void take_back();
  void serve(Task& t);

  Core& core_;
  TransportOptions opt_;
  int listen_fd_ = -1, epoll_fd_ = -1, wake_fd_ = -1;
  std::atomic<bool> running_{false}, stopping_{false};
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;  // I/O thread only

  std::mutex mu_;
  std::deque<Task> tasks_;                       // waiting for a worker (all busy)
  std::vector<std::unique_ptr<Worker>> worker_state_;
  std::vector<Worker*> idle_;  // most recently idle last: tasks go to warm threads (caches, malloc arenas)
  enum After { Keep, Drain, Drop };
  struct Returned {
    Conn* conn;
    After next;
    std::string out;  // a whole reply for the I/O thread to write first (slow readers hold no worker)
  };
  std::vector<Returned> returned_;  // from workers
  std::vector<std::unique_ptr<Conn>> graveyard_;   // I/O thread: closed this round
  int busy_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace lily::server
