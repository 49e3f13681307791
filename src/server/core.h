// The server core every API is written against: routes with the API's error envelope, the API key,
// the job bridge to the scheduler, the SSE channel, non-streaming waits, limits and counters. It knows
// nothing of any API's field names: an API is one file that parses its schema into GenParams and turns
// the job's events into its wire format, registered with one call (see server.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "server/chat_format.h"
#include "server/fields.h"
#include "server/http.h"
#include "server/job.h"
#include "text/tokenizer.h"

namespace lily::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port
  std::string api_key;             // empty: no authentication
  std::string model_id = "lily";
  std::string web_dir;             // chat page files; empty: searched next to the executable
  size_t max_body_bytes = size_t(8) << 20;  // after transfer and content decoding; larger bodies get 413
  int keepalive_ms = 2000;         // SSE comment after this much silence
  int64_t default_max_tokens = 4096;
  SpecParams spec;                 // speculative decoding of requests that set none (`spec`, `spec_depth`)

  // Browser origins allowed to call the API (CORS); "*" allows any. Empty: none (same-origin only).
  std::vector<std::string> cors_origins;
  // Host header names accepted besides IP literals, localhost and `host`, when there is no API key
  // (a keyless server refuses other names: DNS rebinding).
  std::vector<std::string> allowed_hosts;
  double request_timeout_s = 0;    // a generation's wall-clock limit; 0: none. Ends it as "length"
  int max_connections = 512;       // open connections (beyond: 503 at once)
  int read_timeout_s = 30;         // one request's head and body, from its first byte
  int idle_timeout_s = 15;         // a keep-alive connection between requests
  RequestLimits limits;
  SchedulerOptions sched;
};

// An error answered with an HTTP status; `type`, `param` and `code` fill the API's envelope.
struct ApiError {
  int status = 400;
  std::string message, type = "invalid_request_error", param, code;
};

// An API's error body for an ApiError (OpenAI's {"error": {...}} unless the route says otherwise).
using ErrorBody = std::function<json(const ApiError&)>;
json openai_error_body(const ApiError& e);

// JSON text for a reply: never throws on ill-formed UTF-8 (it becomes U+FFFD).
std::string dump_json(const json& j);

// `prefix` followed by 24 random hex digits (response ids).
std::string random_id(const char* prefix);

struct RouteOptions {
  ErrorBody errors;        // empty: openai_error_body
  bool open = false;       // served without the API key
  bool json_body = true;   // POST/PUT/PATCH bodies must be Content-Type: application/json (415 otherwise)
  bool quick = false;      // cheap and non-blocking: may run on the transport's I/O thread
};

class Core {
 public:
  Core(Engine& engine, std::shared_ptr<const text::Tokenizer> tok, std::shared_ptr<const ChatFormat> chat,
       ServerOptions opt, Scheduler& sched);

  Engine& engine;
  const std::shared_ptr<const text::Tokenizer> tok;  // may be null: token-id prompts only
  const std::shared_ptr<const ChatFormat> chat;      // may be null: no chat template
  const ServerOptions opt;
  Scheduler& sched;
  const int64_t created;                             // server start, Unix seconds

  // ---- routes ----
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;
  // `path` is exact, or ends in '*': a prefix, the rest in HttpRequest::path_param.
  void route(const std::string& method, const std::string& path, Handler h, RouteOptions o = {});

  // ---- the transport's entry points ----
  // After the request head, before the body is read: CORS preflight, the Host check, the API key, the
  // route and its content type. True when `res` is the whole answer.
  bool screen(const HttpRequest& head, HttpResponse& res);
  bool quick(const std::string& method, const std::string& path) const;
  // The whole request: the route's handler; whatever it throws becomes the route's error envelope.
  void dispatch(HttpRequest& req, HttpResponse& res);
  // A request the transport refused (malformed, too large), in the envelope of the route it was for.
  void refuse(const HttpRequest& req, HttpResponse& res, const ApiError& e);
  void record_status(int status);

  // ---- for API handlers ----
  json parse_body(const HttpRequest& req) const;  // the body as a JSON object, or FieldError
  void need_text(const char* what) const;         // FieldError when there is no tokenizer
  int64_t vocab() const { return engine.config().vocab; }
  int32_t sample_vocab() const;                   // ids the tokenizer can show (and the model has)
  std::vector<int32_t> stop_ids() const;          // the tokenizer's end ids and the config's eos ids
  void check_prompt_ids(const std::vector<int32_t>& ids, const char* param) const;
  // The completion limit for a prompt of `prompt` tokens: `asked` (or the server's default) cut to the
  // room left in the context; FieldError(param, context_length_exceeded) when there is none.
  int64_t max_tokens(std::optional<int64_t> asked, size_t prompt, const char* param) const;

  // Queues a job (ApiError 503 when the queue is full). max_tool_calls: GenJob::set_max_tool_calls.
  std::shared_ptr<GenJob> submit(GenParams gp, std::vector<std::string> stops, std::unique_ptr<OutputStream> parser,
                                 int top_logprobs, bool progress, int max_tool_calls = 0);
  // The error a failed job's result stands for (400 when the request caused it).
  static ApiError result_error(const GenResult& r);

  // Streams a job as server-sent events: `head` first, then for each event what `on_event` appends to
  // `out`, until it returns true; an SSE comment after keepalive_ms of silence. A failed write, or the
  // response ending early, cancels the job.
  using OnEvent = std::function<bool(Event& ev, std::vector<std::string>& out)>;
  void stream(HttpResponse& res, std::shared_ptr<GenJob> job, std::vector<std::string> head, OnEvent on_event) const;
  static std::string sse(const json& j);  // "data: {...}\n\n"
  // Waits on this thread for the job's events, handing each non-final one to `on_event`, and returns
  // the Final event (ApiError when the job failed). Cancels the job when the client leaves.
  Event wait(const HttpRequest& req, GenJob& job, const std::function<void(Event&)>& on_event) const;

  // ---- counters ----
  void count(const std::string& endpoint);
  struct HttpCounts {
    std::map<std::string, uint64_t> by_endpoint, by_status;
  };
  HttpCounts http_counts() const;
  const StreamStats& stream_stats() const { return *stream_stats_; }

 private:
  struct Route {
    std::string method, path;
    bool prefix = false;
    Handler handler;
    RouteOptions opt;
  };
  const Route* find(const std::string& method, const std::string& path) const;
  const Route* find_any(const std::string& path) const;  // any method: for the envelope of refusals
  json error_body(const Route* r, const ApiError& e) const;
  void send_error(const Route* r, HttpResponse& res, const ApiError& e) const;
  bool host_allowed(const std::string& host) const;
  // CORS headers for a request from an allowed Origin.
  void allow_origin(const HttpRequest& req, HttpResponse& res) const;

  std::vector<Route> routes_;
  std::shared_ptr<StreamStats> stream_stats_ = std::make_shared<StreamStats>();
  mutable std::mutex stat_mu_;
  HttpCounts counts_;
};

}  // namespace lily::server
