#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"

namespace lily::server {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Writes all of `data` to a non-blocking socket, waiting up to `timeout_ms` for each bit of progress.
bool write_all(int fd, std::string_view data, int timeout_ms) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int r = ::poll(&p, 1, timeout_ms);
      if (r <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

// True once the peer has closed (or reset) the connection. Pipelined bytes waiting to be read are not
// a close.
bool peer_gone(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return true;
  if (p.revents & POLLIN) {
    char c;
    ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

std::string response_head(const HttpResponse& res, int minor, bool keep_alive, bool chunked, size_t length) {
  std::string h = fmt::format("HTTP/1.{} {} {}\r\n", minor, res.status, status_reason(res.status));
  bool no_body = res.status == 204 || res.status == 304 || res.status < 200;
  if (!no_body) h += fmt::format("Content-Type: {}\r\n", res.content_type.empty() ? "application/octet-stream" : res.content_type);
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  else if (!no_body && length != std::string::npos) h += fmt::format("Content-Length: {}\r\n", length);
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (auto& [k, v] : res.headers.items()) {
    // Header values come from the core; CR/LF would split the response.
    if (k.find_first_of("\r\n:") != std::string::npos || v.find_first_of("\r\n") != std::string::npos) continue;
    h += k + ": " + v + "\r\n";
  }
  h += "\r\n";
  return h;
}

// A streamed body on a worker: chunked on HTTP/1.1, the raw bytes (then a close) on HTTP/1.0.
class SocketSink : public StreamSink {
 public:
  SocketSink(int fd, bool chunked, int timeout_ms) : fd_(fd), chunked_(chunked), timeout_(timeout_ms) {}
  bool write(std::string_view d) override {
    if (failed_) return false;
    if (d.empty()) return true;
    bool ok = chunked_ ? write_all(fd_, fmt::format("{:x}\r\n{}\r\n", d.size(), d), timeout_) : write_all(fd_, d, timeout_);
    failed_ = !ok;
    return ok;
  }
  bool gone() override { return failed_ || peer_gone(fd_); }
  bool finish() {
    if (!failed_ && chunked_) failed_ = !write_all(fd_, "0\r\n\r\n", timeout_);
    return !failed_;
  }

 private:
  int fd_;
  bool chunked_;
  int timeout_;
  bool failed_ = false;
};

int listen_tag, wake_tag;  // epoll data of the listening socket and the wake-up eventfd

}  // namespace

struct HttpServer::Worker {
  std::condition_variable cv;
  std::optional<Task> task;
};

struct HttpServer::Conn {
  int fd = -1;
  enum State { Idle, Reading, Busy, Writing, Draining, Closed } state = Idle;
  std::string in, out;
  size_t out_off = 0;
  bool close_after = false;
  int64_t deadline = 0;  // Idle: idle timeout; Reading: the request's; Writing/Draining: progress
  std::optional<RequestHead> head;
  std::unique_ptr<BodyDecoder> body;
  HttpRequest req;
  bool head_only = false;
  uint32_t events = 0;
};

HttpServer::HttpServer(Core& core, TransportOptions opt) : core_(core), opt_(std::move(opt)) {}

HttpServer::~HttpServer() {
  stop();
  for (auto& [fd, c] : conns_) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

int HttpServer::bind() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(opt_.port);
  int rc = ::getaddrinfo(opt_.host.empty() ? nullptr : opt_.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) fail("cannot listen on {}:{}: {}", opt_.host, opt_.port, gai_strerror(rc));
  int err = 0;
  for (addrinfo* a = res; a && listen_fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    // SO_REUSEADDR lets a restarted server bind while old connections sit in TIME_WAIT; Linux still
    // refuses a second listener on the port. SO_REUSEPORT (which would share it) is never set.
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      err = errno;
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) {
    if (err == EADDRINUSE) fail("cannot listen on {}:{}: the address is already in use (another server on that port?)", opt_.host, opt_.port);
    if (err == EADDRNOTAVAIL) fail("cannot listen on {}:{}: not an address of this machine", opt_.host, opt_.port);
    fail("cannot listen on {}:{}: {}", opt_.host, opt_.port, std::strerror(err));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  int bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);

  // Room for the connection cap in the descriptor limit.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rlim_t want = rlim_t(opt_.max_connections) + rlim_t(opt_.workers) + 256;
    if (rl.rlim_cur < want && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = std::min(want, rl.rlim_max);
      ::setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < want) opt_.max_connections = std::max(8, int(rl.rlim_cur) - opt_.workers - 256);
  }

  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) fail("cannot listen on {}:{}: {}", opt_.host, opt_.port, std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_tag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.ptr = &wake_tag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  return bound;
}

void HttpServer::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& w : worker_state_) w->cv.notify_one();
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }
}

void HttpServer::run() {
  if (listen_fd_ < 0) fail("the server is not bound");
  {
    std::lock_guard lk(mu_);
    for (int i = 0; i < std::max(1, opt_.workers); ++i) worker_state_.push_back(std::make_unique<Worker>());
  }
  for (auto& w : worker_state_) workers_.emplace_back([this, wp = w.get()] { worker(*wp); });
  running_ = true;
  loop();
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  for (auto& t : workers_) t.join();
  workers_.clear();
  for (auto& [fd, c] : conns_) ::close(fd);
  conns_.clear();
  running_ = false;
}

void HttpServer::rearm(Conn& c, uint32_t events) {
  if (c.events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = &c;
  ::epoll_ctl(epoll_fd_, c.events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c.fd, &ev);
  c.events = events;
}

void HttpServer::close_conn(Conn& c) {
  if (c.state == Conn::Closed) return;
  c.state = Conn::Closed;
  // Leave the epoll set explicitly: close() alone does not while a forked child still holds a copy of
  // the descriptor (between fork and exec), and the set would go on reporting the freed Conn.
  if (c.events) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(c.fd);
  c.events = 0;
}

void HttpServer::loop() {
  epoll_event evs[128];
  int64_t last_scan = now_ms();
  while (!stopping_) {
    int n = ::epoll_wait(epoll_fd_, evs, 128, 100);
    for (int i = 0; i < n; ++i) {
      void* p = evs[i].data.ptr;
      if (p == &listen_tag) {
        accept_all();
      } else if (p == &wake_tag) {
        uint64_t v;
        [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof v);
        take_back();
      } else {
        Conn& c = *static_cast<Conn*>(p);
        if (c.state == Conn::Closed || c.state == Conn::Busy) continue;
        uint32_t e = evs[i].events;
        if (e & EPOLLOUT) {
          flush(c);
          if (c.state == Conn::Idle && !c.in.empty()) process(c);
        }
        if ((c.state != Conn::Closed && c.state != Conn::Busy) && (e & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) on_readable(c);
      }
    }
    int64_t now = now_ms();
    if (now - last_scan >= 100) {
      expire(now);
      last_scan = now;
    }
    std::erase_if(conns_, [](const auto& kv) { return kv.second->state == Conn::Closed; });
    graveyard_.clear();
  }
}

void HttpServer::accept_all() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN, or out of descriptors (the cap keeps us below that)
    }
    size_t open = 0;
    for (auto& [k, c] : conns_) open += c->state != Conn::Closed;
    if (open >= size_t(opt_.max_connections)) {
      // Over the cap: a short 503 and close; the write is best effort.
      HttpResponse res;
      HttpRequest none;
      core_.refuse(none, res, ApiError{503, "Too many open connections; retry later", "server_error", "", "server_busy"});
      res.headers.set("Retry-After", "1");
      std::string s = response_head(res, 1, false, false, res.body.size()) + res.body;
      [[maybe_unused]] auto w = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      core_.record_status(503);
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->deadline = now_ms() + opt_.idle_timeout_ms;
    Conn& ref = *c;
    // A connection closed earlier in this round may have had this descriptor; events of the round
    // may still point at it, so it lives until the round ends.
    if (auto old = conns_.find(fd); old != conns_.end()) graveyard_.push_back(std::move(old->second));
    conns_[fd] = std::move(c);
    rearm(ref, EPOLLIN | EPOLLRDHUP);
  }
}

void HttpServer::on_readable(Conn& c) {
  char buf[65536];
  bool eof = false;
  for (int i = 0; i < 16; ++i) {
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      if (c.state != Conn::Draining) c.in.append(buf, size_t(n));
      if (c.in.size() > opt_.wire.head_bytes + (1 << 20)) break;  // process what is there first
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    eof = true;
    break;
  }
  if (c.state == Conn::Draining) {
    if (eof) close_conn(c);
    return;
  }
  process(c);
  // The client closed (or half-closed) its side: what it sent in full is being answered; nothing
  // half-read will be.
  if (eof && (c.state == Conn::Idle || c.state == Conn::Reading)) close_conn(c);
}

// Reads requests out of c.in as far as they have arrived; answers those that need no worker.
void HttpServer::process(Conn& c) {
  while (c.state == Conn::Idle || c.state == Conn::Reading) {
    if (c.state == Conn::Idle) {
      size_t k = 0;
      while (k < c.in.size() && (c.in[k] == '\r' || c.in[k] == '\n')) ++k;
      c.in.erase(0, k);
      if (c.in.empty()) {
        if (c.in.capacity() > (64 << 10)) std::string().swap(c.in);  // an idle connection keeps no big buffer
        return;
      }
      c.state = Conn::Reading;
      c.deadline = now_ms() + opt_.read_timeout_ms;
      c.head.reset();
      c.body.reset();
      c.req = HttpRequest{};
      c.head_only = false;
    }
    if (!c.head) {
      size_t end = find_head_end(c.in);
      if (end == std::string::npos) {
        if (c.in.size() > opt_.wire.head_bytes)
          refuse(c, 431, fmt::format("the request head is larger than {} bytes", opt_.wire.head_bytes));
        return;
      }
      try {
        c.head = parse_request_head(std::string_view(c.in).substr(0, end), opt_.wire);
      } catch (const HttpError& e) {
        refuse(c, e.status, e.what());
        return;
      }
      c.in.erase(0, end);
      c.head_only = c.head->method == "HEAD";
      c.req.method = c.head_only ? "GET" : c.head->method;
      c.req.path = c.head->path;
      c.req.query = c.head->query;
      c.req.headers = c.head->headers;
      HttpResponse res;
      if (core_.screen(c.req, res)) {
        bool body_follows = c.req.headers.has("transfer-encoding") ||
                            (c.req.headers.has("content-length") && c.req.header("content-length") != "0");
        reply(c, res, c.head_only, !c.head->keep_alive || body_follows);
        continue;
      }
      try {
        c.body = std::make_unique<BodyDecoder>(c.req.headers, opt_.body_bytes);
      } catch (const HttpError& e) {
        refuse(c, e.status, e.what());
        return;
      }
      if (c.head->expect_continue && !c.body->done()) {
        c.out += "HTTP/1.1 100 Continue\r\n\r\n";
        flush(c);
        if (c.state == Conn::Closed) return;
      }
    }
    if (!c.body->done()) {
      try {
        size_t used = c.body->feed(c.in);
        c.in.erase(0, used);
      } catch (const HttpError& e) {
        refuse(c, e.status, e.what());
        return;
      }
      if (!c.body->done()) return;
    }
    c.req.body = std::move(c.body->body());
    c.body.reset();
    if (core_.quick(c.req.method, c.req.path)) {
      HttpResponse res;
      core_.dispatch(c.req, res);
      if (res.stream) core_.refuse(c.req, res, ApiError{500, "internal error: a quick route streamed", "server_error", "", "internal_error"});
      reply(c, res, c.head_only, !c.head->keep_alive);
      continue;
    }
    // To a worker: it owns the connection until it hands it back.
    c.state = Conn::Busy;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    c.events = 0;
    {
      std::lock_guard lk(mu_);
      Task t{&c, std::move(c.req), c.head_only};
      if (!idle_.empty()) {
        Worker* w = idle_.back();
        idle_.pop_back();
        w->task = std::move(t);
        w->cv.notify_one();
      } else {
        tasks_.push_back(std::move(t));
      }
    }
    return;
  }
}

void HttpServer::refuse(Conn& c, int status, const std::string& message) {
  HttpResponse res;
  ApiError e{status, message, status >= 500 ? "server_error" : "invalid_request_error", "", ""};
  if (status == 413) e.code = "request_too_large";
  else if (status == 408) e.code = "request_timeout";
  core_.refuse(c.req, res, e);
  reply(c, res, false, true);
}

// An answer written by the I/O thread (errors, quick routes), then the connection reads on or closes.
void HttpServer::reply(Conn& c, HttpResponse& res, bool head_only, bool close) {
  core_.record_status(res.status);
  c.out += response_head(res, c.head ? c.head->minor : 1, !close, false, res.body.size());
  if (!head_only) c.out += res.body;
  c.close_after = close;
  c.state = Conn::Writing;
  c.deadline = now_ms() + opt_.write_timeout_ms;
  c.head.reset();
  c.body.reset();
  flush(c);
}

void HttpServer::flush(Conn& c) {
  while (c.out_off < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += size_t(n);
      if (c.state == Conn::Writing) c.deadline = now_ms() + opt_.write_timeout_ms;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      rearm(c, uint32_t(EPOLLOUT) | (c.state == Conn::Reading ? uint32_t(EPOLLIN) : 0u));
      return;
    }
    close_conn(c);
    return;
  }
  c.out.clear();
  c.out_off = 0;
  if (c.state != Conn::Writing) {
    rearm(c, EPOLLIN | EPOLLRDHUP);
    return;
  }
  if (c.close_after) {
    // A graceful close: stop sending, then read and drop what the client still sends (an unread
    // request body would otherwise turn the close into a reset that can destroy the answer).
    ::shutdown(c.fd, SHUT_WR);
    c.state = Conn::Draining;
    c.in.clear();
    c.deadline = now_ms() + 2000;
    rearm(c, EPOLLIN | EPOLLRDHUP);
    return;
  }
  c.state = Conn::Idle;
  c.deadline = now_ms() + opt_.idle_timeout_ms;
  rearm(c, EPOLLIN | EPOLLRDHUP);
}

void HttpServer::expire(int64_t now) {
  for (auto& [fd, cp] : conns_) {
    Conn& c = *cp;
    if (c.state == Conn::Busy || c.state == Conn::Closed || now < c.deadline) continue;
    if (c.state == Conn::Reading)
      refuse(c, 408, fmt::format("the request did not arrive within {} s", opt_.read_timeout_ms / 1000.0));
    else
      close_conn(c);
  }
}

void HttpServer::take_back() {
  std::vector<Returned> back;
  {
    std::lock_guard lk(mu_);
    back.swap(returned_);
  }
  for (auto& [c, next, out] : back) {
    if (next == Drop) {
      close_conn(*c);
      continue;
    }
    if (!out.empty()) {
      c->out = std::move(out);
      c->out_off = 0;
      c->close_after = next == Drain;
      c->state = Conn::Writing;
      c->deadline = now_ms() + opt_.write_timeout_ms;
      flush(*c);
      if (c->state == Conn::Idle && !c->in.empty()) process(*c);
      continue;
    }
    if (next == Drain) {  // a stream, written and shut down by its worker
      c->state = Conn::Draining;
      c->in.clear();
      c->deadline = now_ms() + 2000;
      rearm(*c, EPOLLIN | EPOLLRDHUP);
      continue;
    }
    c->state = Conn::Idle;
    c->deadline = now_ms() + opt_.idle_timeout_ms;
    rearm(*c, EPOLLIN | EPOLLRDHUP);
    process(*c);  // a pipelined request may already be buffered
  }
}

void HttpServer::worker(Worker& w) {
  std::unique_lock lk(mu_);
  for (;;) {
    std::optional<Task> t;
    if (w.task) {
      t = std::move(w.task);
      w.task.reset();
    } else if (!tasks_.empty()) {
      t = std::move(tasks_.front());
      tasks_.pop_front();
    } else if (stopping_) {
      return;
    } else {
      idle_.push_back(&w);
      w.cv.wait(lk, [&] { return w.task.has_value() || stopping_.load(); });
      if (!w.task) std::erase(idle_, &w);
      continue;
    }
    ++busy_;
    lk.unlock();
    serve(*t);
    lk.lock();
  }
}

void HttpServer::serve(Task& t) {
  Conn& c = *t.conn;
  const int fd = c.fd;
  const int minor = c.head->minor;
  bool keep = c.head->keep_alive && !stopping_;
  t.req.client_gone = [fd] { return peer_gone(fd); };
  HttpResponse res;
  core_.dispatch(t.req, res);  // answers every exception itself
  core_.record_status(res.status);
  Returned back{&c, keep ? Keep : Drain, {}};
  if (res.stream) {
    // A stream is written here, as it is generated; its job ends if the client stops reading.
    bool chunked = minor >= 1 && !t.head_only;
    if (!chunked) keep = false;
    bool ok = write_all(fd, response_head(res, minor, keep, chunked, std::string::npos), opt_.write_timeout_ms);
    if (ok && !t.head_only) {
      SocketSink sink(fd, chunked, opt_.write_timeout_ms);
      res.stream(sink);
      ok = sink.finish();
    }
    res.stream = nullptr;  // ends the job if it has not ended
    if (ok && !keep) ::shutdown(fd, SHUT_WR);
    back.next = !ok ? Drop : keep ? Keep : Drain;
  } else {
    back.out = response_head(res, minor, keep, false, res.body.size());
    if (!t.head_only) back.out += res.body;
  }
  {
    std::lock_guard lk(mu_);
    returned_.push_back(std::move(back));
    --busy_;
  }
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

}  // namespace lily::server
