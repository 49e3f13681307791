// HTTP/1.1 on the wire, as pure functions over bytes: the request head, and the request body through
// its transfer coding (Content-Length or chunked) and content coding (gzip, deflate, br), with the
// decoded size held to a limit whatever the framing. The transport (http_server.cpp) feeds them.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "server/http.h"

namespace lily::server {

// A request the wire layer refuses: answered with `status` and the message, then the connection closes.
struct HttpError : std::runtime_error {
  HttpError(int status, const std::string& message) : std::runtime_error(message), status(status) {}
  int status;
};

struct WireLimits {
  size_t head_bytes = 16 << 10;  // request line + headers (431 beyond)
  size_t headers = 100;          // header lines (431 beyond)
  size_t target_bytes = 8 << 10; // request target (414 beyond)
};

struct RequestHead {
  std::string method, path, query;  // path percent-decoded
  int minor = 1;                    // HTTP/1.minor
  HttpHeaders headers;
  bool keep_alive = true;           // what the client asked for
  bool expect_continue = false;     // Expect: 100-continue
};

// Offset just past the blank line that ends the head at the start of `buf` (CRLF or bare LF line
// ends), or npos when it has not arrived yet.
size_t find_head_end(std::string_view buf);

// Parses a complete head (what find_head_end delimited). HttpError 400/414/417/431 when malformed
// (an unsupported HTTP version or transfer coding is a 400 too: the client's error, not the server's).
RequestHead parse_request_head(std::string_view head, const WireLimits& limits);

// Percent-decoding of a path; false on a malformed escape.
bool percent_decode(std::string_view in, std::string& out);

const char* status_reason(int status);

// The body of one request. Construct it from the head; feed() it the bytes that follow.
class BodyDecoder {
 public:
  // HttpError: 400 for contradictory or malformed framing or a transfer coding other than chunked, 415 for a content coding other than gzip/deflate/br/identity, 413 when Content-Length
  // already exceeds `limit`.
  BodyDecoder(const HttpHeaders& headers, size_t limit);
  ~BodyDecoder();
  BodyDecoder(const BodyDecoder&) = delete;
  BodyDecoder& operator=(const BodyDecoder&) = delete;

  bool done() const { return done_; }
  // Consumes bytes from the front of `in` (none past the end of this body) and returns how many.
  // HttpError 413 as soon as the decoded body would exceed the limit (nothing more is inflated),
  // 400 for a malformed chunk or compressed stream.
  size_t feed(std::string_view in);
  std::string& body() { return body_; }

 private:
  enum class Framing { Length, Chunked };
  enum class Chunk { Size, Data, DataEnd, Trailer };
  struct Inflater;
  void decoded(std::string_view raw, bool last);  // raw content bytes, through the content coding
  void zlib(std::string_view raw, bool last);
  void brotli(std::string_view raw);
  void append(const char* p, size_t n);
  void finish();

  size_t limit_;
  size_t raw_cap_;          // bytes on the wire: the limit plus what compression may add
  Framing framing_ = Framing::Length;
  uint64_t remaining_ = 0;  // Length: bytes left; Chunked/Data: bytes left in the chunk
  Chunk chunk_ = Chunk::Size;
  std::string line_;        // chunked: the size or trailer line being read
  size_t raw_total_ = 0;
  bool done_ = false;
  std::unique_ptr<Inflater> inflater_;
  std::string body_;
};

}  // namespace lily::server
