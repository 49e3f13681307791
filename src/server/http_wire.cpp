#include "server/http_wire.h"

#include <brotli/decode.h>
#include <zlib.h>

#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace lily::server {

namespace {

bool is_tchar(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Comma-separated tokens of a header value, lower-cased.
std::vector<std::string> tokens(std::string_view v) {
  std::vector<std::string> out;
  while (!v.empty()) {
    size_t c = v.find(',');
    std::string_view t = trim(v.substr(0, c));
    if (!t.empty()) out.push_back(ascii_lower(t));
    if (c == std::string_view::npos) break;
    v.remove_prefix(c + 1);
  }
  return out;
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

size_t find_head_end(std::string_view buf) {
  for (size_t i = buf.find('\n'); i != std::string_view::npos; i = buf.find('\n', i + 1)) {
    if (i + 1 < buf.size() && buf[i + 1] == '\n') return i + 2;
    if (i + 2 < buf.size() && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
  }
  return std::string_view::npos;
}

bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int h = hexval(in[i + 1]), l = hexval(in[i + 2]);
    if (h < 0 || l < 0) return false;
    out.push_back(char(h * 16 + l));
    i += 2;
  }
  return true;
}

const char* status_reason(int s) {
  switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 421: return "Misdirected Request";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return s < 300 ? "OK" : s < 500 ? "Bad Request" : "Server Error";
  }
}

RequestHead parse_request_head(std::string_view head, const WireLimits& lim) {
  if (head.size() > lim.head_bytes) throw HttpError(431, fmt::format("the request head is larger than {} bytes", lim.head_bytes));
  // Lines, CRLF or bare LF; a CR anywhere else is malformed.
  std::vector<std::string_view> lines;
  while (!head.empty()) {
    size_t n = head.find('\n');
    std::string_view line = head.substr(0, n);
    head.remove_prefix(n == std::string_view::npos ? head.size() : n + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find('\r') != std::string_view::npos) throw HttpError(400, "a bare CR in the request head");
    lines.push_back(line);
  }
  while (!lines.empty() && lines.front().empty()) lines.erase(lines.begin());  // CRLFs before the request line
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) throw HttpError(400, "an empty request");

  RequestHead h;
  std::string_view rl = lines[0];
  size_t s1 = rl.find(' ');
  size_t s2 = s1 == std::string_view::npos ? s1 : rl.find(' ', s1 + 1);
  if (s1 == 0 || s2 == std::string_view::npos || rl.find(' ', s2 + 1) != std::string_view::npos)
    throw HttpError(400, "a malformed request line (want METHOD TARGET HTTP/1.1)");
  std::string_view method = rl.substr(0, s1), target = rl.substr(s1 + 1, s2 - s1 - 1), version = rl.substr(s2 + 1);
  for (unsigned char c : method)
    if (!is_tchar(c)) throw HttpError(400, "a malformed request method");
  if (version == "HTTP/1.1") h.minor = 1;
  else if (version == "HTTP/1.0") h.minor = 0;
  else if (version.size() == 8 && version.substr(0, 5) == "HTTP/" && version[6] == '.') throw HttpError(400, "only HTTP/1.0 and HTTP/1.1 are served");
  else throw HttpError(400, "a malformed HTTP version");
  if (target.empty()) throw HttpError(400, "an empty request target");
  if (target.size() > lim.target_bytes) throw HttpError(414, fmt::format("the request target is longer than {} bytes", lim.target_bytes));
  for (unsigned char c : target)
    if (c <= 0x20 || c == 0x7f) throw HttpError(400, "a control character in the request target");
  h.method = std::string(method);
  // absolute-form (proxies): drop scheme and authority.
  if (target.substr(0, 7) == "http://" || target.substr(0, 8) == "https://") {
    size_t slash = target.find('/', target.find("//") + 2);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  if (target != "*" && target.front() != '/') throw HttpError(400, "the request target must start with '/'");
  size_t q = target.find('?');
  std::string_view raw_path = target.substr(0, q);
  if (q != std::string_view::npos) h.query = std::string(target.substr(q + 1));
  if (size_t f = raw_path.find('#'); f != std::string_view::npos) raw_path = raw_path.substr(0, f);
  if (!percent_decode(raw_path, h.path)) throw HttpError(400, "a malformed percent-escape in the request path");

  if (lines.size() - 1 > lim.headers) throw HttpError(431, fmt::format("more than {} header lines", lim.headers));
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    if (l.empty()) throw HttpError(400, "an empty line inside the request head");
    if (l.front() == ' ' || l.front() == '\t') throw HttpError(400, "folded header lines are not accepted");
    size_t colon = l.find(':');
    if (colon == std::string_view::npos || colon == 0) throw HttpError(400, "a header line without a name");
    std::string_view name = l.substr(0, colon), value = trim(l.substr(colon + 1));
    for (unsigned char c : name)
      if (!is_tchar(c)) throw HttpError(400, "a malformed header name");
    for (unsigned char c : value)
      if ((c < 0x20 && c != '\t') || c == 0x7f) throw HttpError(400, "a control character in a header value");
    h.headers.add(std::string(name), std::string(value));
  }

  int hosts = 0;
  for (auto& [k, v] : h.headers.items()) hosts += iequals(k, "host");
  if (h.minor == 1 && hosts != 1) throw HttpError(400, hosts ? "more than one Host header" : "an HTTP/1.1 request needs a Host header");
  h.keep_alive = h.minor == 1;
  for (auto& [k, v] : h.headers.items())
    if (iequals(k, "connection"))
      for (auto& t : tokens(v)) {
        if (t == "close") h.keep_alive = false;
        if (t == "keep-alive") h.keep_alive = true;
      }
  std::string expect = ascii_lower(trim(h.headers.get("expect")));
  if (!expect.empty()) {
    if (expect != "100-continue") throw HttpError(417, "Expect: only 100-continue is understood");
    h.expect_continue = h.minor == 1;
  }
  return h;
}

// ---- content codings ----

struct BodyDecoder::Inflater {
  enum Kind { Gzip, Deflate, Brotli } kind;
  z_stream z{};
  bool started = false, ended = false;
  std::string prefix;  // deflate: the first two bytes, to tell zlib-wrapped from raw
  BrotliDecoderState* br = nullptr;

  explicit Inflater(Kind k) : kind(k) {
    if (kind == Brotli && !(br = BrotliDecoderCreateInstance(nullptr, nullptr, nullptr))) throw std::bad_alloc();
  }
  ~Inflater() {
    if (started) inflateEnd(&z);
    if (br) BrotliDecoderDestroyInstance(br);
  }
};

BodyDecoder::BodyDecoder(const HttpHeaders& headers, size_t limit)
    : limit_(limit), raw_cap_(limit + limit / 64 + 4096) {
  bool has_te = false, has_cl = false;
  std::string cl;
  std::vector<std::string> te, ce;
  for (auto& [k, v] : headers.items()) {
    if (iequals(k, "transfer-encoding")) {
      has_te = true;
      for (auto& t : tokens(v)) te.push_back(t);
    } else if (iequals(k, "content-length")) {
      for (auto& t : tokens(v)) {
        if (has_cl && t != cl) throw HttpError(400, "conflicting Content-Length values");
        cl = t;
        has_cl = true;
      }
      if (tokens(v).empty()) throw HttpError(400, "an empty Content-Length");
    } else if (iequals(k, "content-encoding")) {
      for (auto& t : tokens(v)) ce.push_back(t);
    }
  }
  if (has_te && has_cl) throw HttpError(400, "a request may not carry both Transfer-Encoding and Content-Length");
  if (has_te) {
    if (te.size() != 1 || te[0] != "chunked")
      throw HttpError(400, "only 'Transfer-Encoding: chunked' is supported");
    framing_ = Framing::Chunked;
  } else {
    framing_ = Framing::Length;
    if (has_cl) {
      if (cl.empty() || cl.size() > 19) throw HttpError(400, "Content-Length is not a valid length");
      for (char c : cl)
        if (c < '0' || c > '9') throw HttpError(400, "Content-Length is not a valid length");
      remaining_ = std::stoull(cl);
    }
    if (remaining_ > raw_cap_)
      throw HttpError(413, fmt::format("the request body ({} bytes) is larger than the limit of {} bytes", remaining_, limit_));
    if (!ce.empty() && ce.size() == 1 && ce[0] == "identity") ce.clear();
    done_ = remaining_ == 0;
  }
  if (ce.size() > 1) throw HttpError(415, "only one Content-Encoding (gzip, deflate or br) is supported");
  if (!ce.empty()) {
    const std::string& c = ce[0];
    if (c == "gzip" || c == "x-gzip") inflater_ = std::make_unique<Inflater>(Inflater::Gzip);
    else if (c == "deflate") inflater_ = std::make_unique<Inflater>(Inflater::Deflate);
    else if (c == "br") inflater_ = std::make_unique<Inflater>(Inflater::Brotli);
    else if (c != "identity") throw HttpError(415, fmt::format("Content-Encoding '{}' is not supported (gzip, deflate, br)", c.substr(0, 40)));
  }
  if (done_) finish();
}

BodyDecoder::~BodyDecoder() = default;

void BodyDecoder::append(const char* p, size_t n) {
  if (body_.size() + n > limit_)
    throw HttpError(413, fmt::format("the request body is larger than the limit of {} bytes", limit_));
  body_.append(p, n);
}

// Content bytes (after the transfer coding) through the content coding into the body. Compressed data
// is inflated 16 KiB of output at a time, so the limit stops a decompression bomb right after it.
void BodyDecoder::decoded(std::string_view raw, bool last) {
  raw_total_ += raw.size();
  if (raw_total_ > raw_cap_) throw HttpError(413, fmt::format("the request body is larger than the limit of {} bytes", limit_));
  if (!inflater_) {
    append(raw.data(), raw.size());
    return;
  }
  if (inflater_->kind == Inflater::Brotli) brotli(raw);
  else zlib(raw, last);
  if (last && !inflater_->ended) throw HttpError(400, "the compressed request body is truncated");
}

void BodyDecoder::zlib(std::string_view raw, bool last) {
  Inflater& f = *inflater_;
  std::string joined;
  if (!f.started) {
    // HTTP's deflate is zlib-wrapped, but some clients send raw deflate: the zlib header's check bits
    // tell them apart.
    f.prefix.append(raw);
    if ((f.prefix.size() < 2 && !last) || f.prefix.empty()) return;
    unsigned b0 = static_cast<unsigned char>(f.prefix[0]), b1 = f.prefix.size() > 1 ? static_cast<unsigned char>(f.prefix[1]) : 0;
    bool raw_deflate = f.kind == Inflater::Deflate && !((b0 & 0x0f) == 8 && ((b0 << 8) | b1) % 31 == 0);
    if (inflateInit2(&f.z, raw_deflate ? -15 : f.kind == Inflater::Gzip ? 15 + 16 : 15) != Z_OK) throw std::bad_alloc();
    f.started = true;
    joined = std::move(f.prefix);
    raw = joined;
  }
  char out[16384];
  for (;;) {
    if (f.ended) {
      if (raw.empty()) return;
      if (f.kind != Inflater::Gzip) throw HttpError(400, "data after the end of the deflate stream");
      inflateReset(&f.z);  // another gzip member
      f.ended = false;
    }
    size_t given = std::min<size_t>(raw.size(), 1 << 20);
    f.z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
    f.z.avail_in = uInt(given);
    f.z.next_out = reinterpret_cast<Bytef*>(out);
    f.z.avail_out = sizeof out;
    int rc = inflate(&f.z, Z_NO_FLUSH);
    raw.remove_prefix(given - f.z.avail_in);
    append(out, sizeof out - f.z.avail_out);
    if (rc == Z_STREAM_END) {
      f.ended = true;
      continue;
    }
    if (rc == Z_BUF_ERROR && raw.empty()) return;  // wants more input
    if (rc != Z_OK) throw HttpError(400, "the request body is not valid gzip/deflate data");
    if (raw.empty() && f.z.avail_out != 0) return;  // input used up, output not pending
  }
}

void BodyDecoder::brotli(std::string_view raw) {
  Inflater& f = *inflater_;
  char out[16384];
  for (;;) {
    if (f.ended) {
      if (!raw.empty()) throw HttpError(400, "data after the end of the brotli stream");
      return;
    }
    size_t avail_in = raw.size(), avail_out = sizeof out;
    const uint8_t* next_in = reinterpret_cast<const uint8_t*>(raw.data());
    uint8_t* next_out = reinterpret_cast<uint8_t*>(out);
    auto rc = BrotliDecoderDecompressStream(f.br, &avail_in, &next_in, &avail_out, &next_out, nullptr);
    raw.remove_prefix(raw.size() - avail_in);
    append(out, sizeof out - avail_out);
    if (rc == BROTLI_DECODER_RESULT_ERROR) throw HttpError(400, "the request body is not valid brotli data");
    if (rc == BROTLI_DECODER_RESULT_SUCCESS) f.ended = true;
    else if (rc == BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT) return;
  }
}

void BodyDecoder::finish() {
  if (inflater_) decoded({}, true);
  done_ = true;
}

size_t BodyDecoder::feed(std::string_view in) {
  size_t used = 0;
  if (framing_ == Framing::Length) {
    size_t n = size_t(std::min<uint64_t>(remaining_, in.size()));
    if (n) decoded(in.substr(0, n), false);
    remaining_ -= n;
    used = n;
    if (remaining_ == 0 && !done_) finish();
    return used;
  }
  while (used < in.size() && !done_) {
    std::string_view rest = in.substr(used);
    if (chunk_ == Chunk::Data) {
      size_t n = size_t(std::min<uint64_t>(remaining_, rest.size()));
      decoded(rest.substr(0, n), false);
      remaining_ -= n;
      used += n;
      if (remaining_ == 0) chunk_ = Chunk::DataEnd;
      continue;
    }
    // Line-oriented states: size lines, the CRLF after data, trailers.
    size_t nl = rest.find('\n');
    size_t take = nl == std::string_view::npos ? rest.size() : nl + 1;
    line_.append(rest.substr(0, take));
    used += take;
    if (line_.size() > 4096) throw HttpError(400, "a chunk-size or trailer line longer than 4096 bytes");
    if (nl == std::string_view::npos) break;
    std::string_view line = line_;
    line.remove_suffix(1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (chunk_ == Chunk::DataEnd) {
      if (!line.empty()) throw HttpError(400, "chunk data longer than its declared size");
      chunk_ = Chunk::Size;
    } else if (chunk_ == Chunk::Size) {
      std::string_view hex = line.substr(0, line.find(';'));
      hex = trim(hex);
      if (hex.empty() || hex.size() > 15) throw HttpError(400, "a malformed chunk size");
      uint64_t n = 0;
      for (char c : hex) {
        int v = hexval(c);
        if (v < 0) throw HttpError(400, "a malformed chunk size");
        n = n * 16 + uint64_t(v);
      }
      if (n > raw_cap_) throw HttpError(413, fmt::format("the request body is larger than the limit of {} bytes", limit_));
      remaining_ = n;
      chunk_ = n == 0 ? Chunk::Trailer : Chunk::Data;
    } else {  // trailers, ignored, until the empty line
      if (line.empty()) finish();
    }
    line_.clear();
  }
  return used;
}

}  // namespace lily::server
