#include "server/core.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <random>

#include <fmt/format.h>

#include "server/json_body.h"
#include "text/utf8.h"

namespace lily::server {

json openai_error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), uint32_t(rng()));
}

namespace {

// Equal strings, in time that depends only on the longer length (API keys).
bool same_secret(std::string_view a, std::string_view b) {
  size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    unsigned x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u, y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= x ^ y;
  }
  return diff == 0;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

Core::Core(Engine& e, std::shared_ptr<const text::Tokenizer> t, std::shared_ptr<const ChatFormat> c, ServerOptions o,
           Scheduler& s)
    : engine(e), tok(std::move(t)), chat(std::move(c)), opt(std::move(o)), sched(s), created(int64_t(std::time(nullptr))) {}

void Core::route(const std::string& method, const std::string& path, Handler h, RouteOptions o) {
  Route r;
  r.method = method;
  r.prefix = !path.empty() && path.back() == '*';
  r.path = r.prefix ? path.substr(0, path.size() - 1) : path;
  r.handler = std::move(h);
  r.opt = std::move(o);
  routes_.push_back(std::move(r));
}

// Exact paths first, then the longest matching prefix.
const Core::Route* Core::find(const std::string& method, const std::string& path) const {
  const Route* best = nullptr;
  for (auto& r : routes_) {
    if (r.method != method) continue;
    if (!r.prefix && path == r.path) return &r;
    if (r.prefix && path.size() > r.path.size() && starts_with(path, r.path) && (!best || r.path.size() > best->path.size()))
      best = &r;
  }
  return best;
}

const Core::Route* Core::find_any(const std::string& path) const {
  for (const char* m : {"POST", "GET", "PUT", "PATCH", "DELETE"})
    if (const Route* r = find(m, path)) return r;
  return nullptr;
}

bool Core::quick(const std::string& method, const std::string& path) const {
  const Route* r = find(method, path);
  return r && r->opt.quick;
}

json Core::error_body(const Route* r, const ApiError& e) const {
  return r && r->opt.errors ? r->opt.errors(e) : openai_error_body(e);
}

void Core::send_error(const Route* r, HttpResponse& res, const ApiError& e) const {
  res.status = e.status;
  res.stream = nullptr;
  if (e.status == 503) res.headers.set("Retry-After", std::to_string(sched.retry_after_seconds()));
  res.set(dump_json(error_body(r, e)), "application/json");
}

namespace {

bool is_ipv4(const std::string& s) {
  int parts = 0, digits = 0;
  for (char c : s) {
    if (c == '.') {
      if (!digits) return false;
      ++parts;
      digits = 0;
    } else if (c >= '0' && c <= '9' && digits < 3) {
      ++digits;
    } else {
      return false;
    }
  }
  return parts == 3 && digits;
}

}  // namespace

bool Core::host_allowed(const std::string& host_header) const {
  std::string h = ascii_lower(host_header);
  if (h.empty()) return true;  // HTTP/1.0 without Host
  if (h.front() == '[') return h.find(']') != std::string::npos;  // an IPv6 literal
  if (size_t colon = h.rfind(':'); colon != std::string::npos) {
    std::string port = h.substr(colon + 1);
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos) return false;
    h = h.substr(0, colon);
  }
  if (!h.empty() && h.back() == '.') h.pop_back();
  if (is_ipv4(h) || h == "localhost" || (h.size() > 10 && h.substr(h.size() - 10) == ".localhost")) return true;
  if (h == ascii_lower(opt.host)) return true;
  for (auto& a : opt.allowed_hosts)
    if (a == "*" || ascii_lower(a) == h) return true;
  return false;
}

void Core::allow_origin(const HttpRequest& req, HttpResponse& res) const {
  std::string origin = req.header("Origin");
  if (origin.empty() || opt.cors_origins.empty()) return;
  for (auto& o : opt.cors_origins) {
    if (o == "*") {
      res.headers.set("Access-Control-Allow-Origin", "*");
      return;
    }
    if (ascii_lower(o) == ascii_lower(origin) && origin.find_first_of("\r\n") == std::string::npos) {
      res.headers.set("Access-Control-Allow-Origin", origin);
      res.headers.set("Vary", "Origin");
      return;
    }
  }
}

bool Core::screen(const HttpRequest& head, HttpResponse& res) {
  allow_origin(head, res);
  if (head.method == "OPTIONS") {
    res.status = 204;
    res.set("", "text/plain");
    res.headers.set("Allow", "GET, POST, OPTIONS");
    if (res.headers.has("Access-Control-Allow-Origin")) {
      res.headers.set("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.headers.set("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key, Anthropic-Version, OpenAI-Beta");
      res.headers.set("Access-Control-Max-Age", "600");
    }
    return true;
  }
  const Route* r = find(head.method, head.path);
  if (opt.api_key.empty() && !host_allowed(head.header("Host"))) {
    send_error(r, res,
               ApiError{403,
                        fmt::format("Host '{}' is not a name of this server: without --api-key it answers only IP addresses, "
                                    "localhost and the names given with --allow-host (a DNS-rebinding guard)",
                                    text::utf8_sanitize(head.header("Host").substr(0, 200))),
                        "invalid_request_error", "", "host_not_allowed"});
    return true;
  }
  if (!opt.api_key.empty() && !(r && r->opt.open)) {
    const auto& key = opt.api_key;
    std::string auth = head.header("Authorization"), xkey = head.header("x-api-key");
    bool bearer = starts_with(auth, "Bearer ") && same_secret(std::string_view(auth).substr(7), key);
    if (!bearer && !(head.headers.has("x-api-key") && same_secret(xkey, key))) {
      send_error(r, res, ApiError{401, "Incorrect or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')", "authentication_error", "",
                                  "invalid_api_key"});
      return true;
    }
  }
  if (!r) {
    send_error(r, res, ApiError{404, fmt::format("Unknown route: {} {}", text::utf8_sanitize(head.method), text::utf8_sanitize(head.path)),
                                "invalid_request_error", "", "not_found"});
    return true;
  }
  if (r->opt.json_body && (head.method == "POST" || head.method == "PUT" || head.method == "PATCH")) {
    std::string ct = head.header("Content-Type");
    std::string media = ascii_lower(ct.substr(0, ct.find(';')));
    while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.pop_back();
    while (!media.empty() && (media.front() == ' ' || media.front() == '\t')) media.erase(0, 1);
    if (media != "application/json") {
      send_error(r, res, ApiError{415, fmt::format("The request body must be JSON sent as 'Content-Type: application/json' (got '{}')",
                                                   text::utf8_sanitize(ct.substr(0, 100))),
                                  "invalid_request_error", "", "unsupported_media_type"});
      return true;
    }
  }
  return false;
}

void Core::dispatch(HttpRequest& req, HttpResponse& res) {
  const Route* r = find(req.method, req.path);
  allow_origin(req, res);
  try {
    if (!r)
      throw ApiError{404, fmt::format("Unknown route: {} {}", req.method, text::utf8_sanitize(req.path)), "invalid_request_error",
                     "", "not_found"};
    if (r->prefix) req.path_param = req.path.substr(r->path.size());
    r->handler(req, res);
  } catch (const ApiError& e) {
    send_error(r, res, e);
  } catch (const FieldError& e) {
    send_error(r, res, ApiError{400, text::utf8_sanitize(e.what()), "invalid_request_error", e.param, e.code});
  } catch (const InputError& e) {
    send_error(r, res, ApiError{400, text::utf8_sanitize(e.what()), "invalid_request_error", "", "invalid_value"});
  } catch (const std::exception& e) {
    send_error(r, res, ApiError{500, fmt::format("internal error: {}", text::utf8_sanitize(e.what())), "server_error", "",
                                "internal_error"});
  } catch (...) {
    send_error(r, res, ApiError{500, "internal error", "server_error", "", "internal_error"});
  }
}

void Core::refuse(const HttpRequest& req, HttpResponse& res, const ApiError& e) {
  allow_origin(req, res);
  send_error(find_any(req.path), res, e);
}

void Core::record_status(int status) {
  std::lock_guard lk(stat_mu_);
  ++counts_.by_status[std::to_string(status)];
}

void Core::count(const std::string& endpoint) {
  std::lock_guard lk(stat_mu_);
  ++counts_.by_endpoint[endpoint];
}

Core::HttpCounts Core::http_counts() const {
  std::lock_guard lk(stat_mu_);
  return counts_;
}

json Core::parse_body(const HttpRequest& req) const {
  json b = parse_json(req.body, opt.limits.json);
  if (!b.is_object()) bad("", "the request body must be a JSON object", "invalid_json");
  return b;
}

void Core::need_text(const char* what) const {
  if (!tok) bad("", fmt::format("{} needs a tokenizer, and this model has none (serve it with --tokenizer DIR)", what), "no_tokenizer");
}

int32_t Core::sample_vocab() const { return tok ? int32_t(std::min<int64_t>(tok->vocab_size(), vocab())) : 0; }

std::vector<int32_t> Core::stop_ids() const {
  std::vector<int32_t> ids;
  if (tok) ids = tok->stop_ids();
  for (auto id : engine.config().eos_ids)
    if (std::find(ids.begin(), ids.end(), int32_t(id)) == ids.end()) ids.push_back(int32_t(id));
  std::erase_if(ids, [&](int32_t id) { return id < 0 || id >= vocab(); });
  return ids;
}

void Core::check_prompt_ids(const std::vector<int32_t>& ids, const char* param) const {
  if (ids.empty()) bad(param, "the prompt is empty");
  for (int32_t t : ids)
    if (t < 0 || t >= vocab()) bad(param, fmt::format("prompt token id {} is outside the model's vocabulary (0..{})", t, vocab() - 1));
}

int64_t Core::max_tokens(std::optional<int64_t> asked, size_t prompt, const char* param) const {
  int64_t room = sched.ctx_size() - int64_t(prompt);
  if (room < 1)
    bad(param, fmt::format("the prompt has {} tokens, which does not fit the context size {}", prompt, sched.ctx_size()),
        "context_length_exceeded");
  return std::min(room, asked.value_or(opt.default_max_tokens));
}

std::shared_ptr<GenJob> Core::submit(GenParams gp, std::vector<std::string> stops, std::unique_ptr<OutputStream> parser,
                                     int top_logprobs, bool progress, int max_tool_calls) {
  auto job = std::make_shared<GenJob>(std::move(gp), tok, std::move(stops), std::move(parser), top_logprobs, progress);
  job->stats = stream_stats_;
  job->set_max_tool_calls(max_tool_calls);
  if (opt.request_timeout_s > 0)
    job->set_deadline(GenJob::Clock::now() + std::chrono::microseconds(int64_t(opt.request_timeout_s * 1e6)));
  if (!sched.submit(job))
    throw ApiError{503, "The server is busy: every slot is in use and the queue is full; retry later", "server_error", "",
                   "server_busy"};
  return job;
}

ApiError Core::result_error(const GenResult& r) {
  return ApiError{r.error_is_input ? 400 : 500, r.error, r.error_is_input ? "invalid_request_error" : "server_error", "",
                  r.error_is_input ? "invalid_value" : "internal_error"};
}

std::string Core::sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

namespace {

// Cancels the job when the last copy of a stream's body function is gone: a response that ended early
// (or never started) stops its generation; after a finished job it does nothing.
struct CancelAtEnd {
  explicit CancelAtEnd(std::shared_ptr<GenJob> j) : job(std::move(j)) {}
  CancelAtEnd(const CancelAtEnd&) = delete;
  ~CancelAtEnd() { job->cancel(); }
  std::shared_ptr<GenJob> job;
};

}  // namespace

void Core::stream(HttpResponse& res, std::shared_ptr<GenJob> job, std::vector<std::string> head, OnEvent on_event) const {
  int keepalive = opt.keepalive_ms;
  res.headers.set("Cache-Control", "no-cache");
  res.headers.set("X-Accel-Buffering", "no");
  res.content_type = "text/event-stream";
  auto guard = std::make_shared<CancelAtEnd>(job);
  res.stream = [guard, head = std::move(head), on_event = std::move(on_event), keepalive](StreamSink& sink) {
    GenJob& j = *guard->job;
    auto write = [&](const std::string& s) {
      if (sink.write(s)) return true;
      j.cancel();
      return false;
    };
    for (auto& h : head)
      if (!write(h)) return;
    // Events that write nothing (tokens still held back, or no text at all) keep a stream busy without
    // touching the socket, so the client is also polled every 100 ms.
    auto quiet_since = GenJob::Clock::now(), next_check = quiet_since;
    for (;;) {
      auto ev = j.channel.pop(std::min(keepalive, 250));
      j.check_deadline();
      if (GenJob::Clock::now() >= next_check) {
        next_check = GenJob::Clock::now() + std::chrono::milliseconds(100);
        if (sink.gone()) {
          j.cancel();
          return;
        }
      }
      if (!ev) {
        if (GenJob::Clock::now() - quiet_since >= std::chrono::milliseconds(keepalive)) {
          if (!write(": keep-alive\n\n")) return;
          quiet_since = GenJob::Clock::now();
        }
        continue;
      }
      quiet_since = GenJob::Clock::now();
      std::vector<std::string> out;
      bool final = on_event(*ev, out);
      for (auto& s : out)
        if (!write(s)) return;
      if (final) return;
    }
  };
}

Event Core::wait(const HttpRequest& req, GenJob& job, const std::function<void(Event&)>& on_event) const {
  // The client and the deadline are checked every 100 ms, events flowing or not.
  auto next_check = GenJob::Clock::now();
  for (;;) {
    auto ev = job.channel.pop(100);
    if (GenJob::Clock::now() >= next_check) {
      next_check = GenJob::Clock::now() + std::chrono::milliseconds(100);
      job.check_deadline();
      if (req.client_gone && req.client_gone()) job.cancel();
    }
    if (!ev) continue;
    if (ev->kind == Event::Final) {
      if (ev->result.finish_reason == "error") throw result_error(ev->result);
      return std::move(*ev);
    }
    on_event(*ev);
  }
}

}  // namespace lily::server
