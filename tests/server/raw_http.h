// Raw-socket HTTP for the server tests: requests a client library would refuse to send (bad framing,
// invalid bytes, half-sent bodies), and the reply read back byte by byte.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

namespace lily::server::test {

inline int connect_port(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

struct RawReply {
  int status = 0;         // 0: no status line arrived
  std::string head, body; // body de-chunked
  bool reset = false;     // ECONNRESET while reading
  bool closed = false;    // the server closed the connection
  bool timed_out = false;
  double ms = 0;          // from the first byte sent to the reply read
  std::string header(const std::string& name) const {
    std::string h = "\r\n";
    for (size_t i = 0; i < head.size(); ++i) h += char(std::tolower(static_cast<unsigned char>(head[i])));
    std::string key = "\r\n";
    for (char c : name) key += char(std::tolower(static_cast<unsigned char>(c)));
    key += ":";
    size_t at = h.find(key);
    if (at == std::string::npos) return "";
    size_t start = at + key.size() - 2, end = head.find("\r\n", start);
    std::string v = head.substr(start, end == std::string::npos ? std::string::npos : end - start);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    return v;
  }
};

// Reads one reply from `fd` (Content-Length, chunked, or until close), waiting at most timeout_ms.
// `carry` holds bytes read past this reply (pipelined replies) for the next call.
inline RawReply read_reply(int fd, int timeout_ms, std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now(),
                           std::string* carry = nullptr) {
  RawReply r;
  std::string local;
  std::string& buf = carry ? *carry : local;
  auto deadline = t0 + std::chrono::milliseconds(timeout_ms);
  auto fill = [&]() {
    int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) {
      r.timed_out = true;
      return false;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) {
      r.timed_out = true;
      return false;
    }
    char tmp[65536];
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n < 0 && errno == ECONNRESET) r.reset = true;
    if (n <= 0) {
      r.closed = true;
      return false;
    }
    buf.append(tmp, size_t(n));
    return true;
  };
  size_t he;
  while ((he = buf.find("\r\n\r\n")) == std::string::npos)
    if (!fill()) return r;
  r.head = buf.substr(0, he);
  buf.erase(0, he + 4);
  if (r.head.size() > 12) r.status = std::atoi(r.head.c_str() + 9);
  if (r.status == 100) {  // 100 Continue: the real reply follows
    RawReply next;
    while ((he = buf.find("\r\n\r\n")) == std::string::npos)
      if (!fill()) return r;
    r.head = buf.substr(0, he);
    buf.erase(0, he + 4);
    r.status = std::atoi(r.head.c_str() + 9);
  }
  std::string cl = r.header("Content-Length");
  if (r.header("Transfer-Encoding") == "chunked") {
    for (;;) {
      size_t nl;
      while ((nl = buf.find("\r\n")) == std::string::npos)
        if (!fill()) return r;
      size_t n = std::stoul(buf.substr(0, nl), nullptr, 16);
      buf.erase(0, nl + 2);
      while (buf.size() < n + 2)
        if (!fill()) return r;
      r.body += buf.substr(0, n);
      buf.erase(0, n + 2);
      if (n == 0) break;
    }
  } else if (!cl.empty()) {
    size_t n = std::stoul(cl);
    while (buf.size() < n)
      if (!fill()) return r;
    r.body = buf.substr(0, n);
    buf.erase(0, n);
  } else if (r.status != 204 && r.status != 304) {
    while (fill()) {
    }
    r.body = buf;
    buf.clear();
  }
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// One request on a fresh connection.
inline RawReply raw_request(int port, const std::string& bytes, int timeout_ms = 10000) {
  int fd = connect_port(port);
  RawReply r;
  if (fd < 0) {
    r.closed = true;
    return r;
  }
  auto t0 = std::chrono::steady_clock::now();
  send_all(fd, bytes);
  r = read_reply(fd, timeout_ms, t0);
  ::close(fd);
  return r;
}

// A POST with the given body and extra header lines (each ending in \r\n).
inline std::string post_bytes(const std::string& path, const std::string& body, const std::string& extra = "",
                              const std::string& type = "application/json") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + type + "\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n" + extra + "\r\n" + body;
}

}  // namespace lily::server::test
