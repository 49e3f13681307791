// The HTTP request and response as the core and the API handlers see them, independent of the
// transport that reads and writes the bytes.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lily::server {

// Header names compare case-insensitively; values are kept as sent.
class HttpHeaders {
 public:
  void add(std::string name, std::string value) { items_.emplace_back(std::move(name), std::move(value)); }
  void set(const std::string& name, std::string value);
  bool has(std::string_view name) const { return find(name) != nullptr; }
  // The first value of `name`, or "" when absent.
  std::string get(std::string_view name) const;
  const std::vector<std::pair<std::string, std::string>>& items() const { return items_; }

 private:
  const std::string* find(std::string_view name) const;
  std::vector<std::pair<std::string, std::string>> items_;
};

bool iequals(std::string_view a, std::string_view b);
std::string ascii_lower(std::string_view s);  // A-Z only: header names, media types, host names

struct HttpRequest {
  std::string method;
  std::string path;        // percent-decoded, without the query; may hold any bytes (never trusted as UTF-8)
  std::string query;       // raw, after '?'
  HttpHeaders headers;
  std::string body;        // decoded (no transfer or content coding left)
  std::string path_param;  // what a route's trailing '*' matched
  // True once the client has closed its connection; empty when the transport cannot tell.
  std::function<bool()> client_gone;

  std::string header(std::string_view name) const { return headers.get(name); }
};

// Where a streamed body goes. write() returns false once the client is gone.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool write(std::string_view data) = 0;
  // True once the client has closed its connection (polled while a stream has nothing to write); false
  // when the transport cannot tell.
  virtual bool gone() { return false; }
};

struct HttpResponse {
  int status = 200;
  HttpHeaders headers;
  std::string content_type = "application/json";
  std::string body;
  // When set, the body is produced by this call (sent chunked as it writes) and `body` is ignored.
  // It runs on the HTTP thread and returns when the body is complete or a write failed.
  std::function<void(StreamSink&)> stream;

  void set(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
};

}  // namespace lily::server
