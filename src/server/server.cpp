#include "server/server.h"

#include <chrono>
#include <filesystem>

#include <fmt/format.h>
#include <httplib.h>

#include "core/error.h"
#include "server/anthropic_messages.h"
#include "server/misc_routes.h"
#include "server/openai_chat.h"
#include "server/openai_completions.h"
#include "server/openai_responses.h"

namespace lily::server {

namespace {

// Every API, registered on the core. A new API is a file with its register function, called here.
void register_apis(Core& core) {
  auto structured = core.tok ? std::make_shared<Structured>(core.tok, int32_t(core.vocab()), core.stop_ids(), core.chat) : nullptr;
  register_openai_chat(core, structured);
  register_anthropic_messages(core, structured);
  register_openai_responses(core, structured, std::make_shared<ResponseStore>());
  register_openai_completions(core);
  register_misc_routes(core);
}

std::string find_web_dir(const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!given.empty()) return given;
  std::vector<fs::path> starts;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  starts.push_back(fs::current_path(ec));
  for (auto d : starts)
    for (int up = 0; up < 5 && !d.empty(); ++up) {
      if (fs::is_regular_file(d / "web" / "index.html", ec)) return (d / "web").string();
      if (d == d.parent_path()) break;
      d = d.parent_path();
    }
  return "";
}

// ---- the transport: cpp-httplib, adapted to the core's request and response ----

HttpRequest from_httplib(const httplib::Request& r, bool with_body) {
  HttpRequest q;
  q.method = r.method;
  q.path = r.path;
  for (auto& [k, v] : r.headers) q.headers.add(k, v);
  if (with_body) q.body = r.body;
  return q;
}

class HttplibSink : public StreamSink {
 public:
  explicit HttplibSink(httplib::DataSink& s) : s_(s) {}
  bool write(std::string_view d) override {
    if (failed_) return false;
    if (!s_.write(d.data(), d.size())) failed_ = true;
    return !failed_;
  }
  bool failed() const { return failed_; }

 private:
  httplib::DataSink& s_;
  bool failed_ = false;
};

void to_httplib(HttpResponse& ours, httplib::Response& res) {
  res.status = ours.status;
  for (auto& [k, v] : ours.headers.items()) res.set_header(k, v);
  if (!ours.stream) {
    res.set_content(ours.body, ours.content_type.c_str());
    return;
  }
  res.set_chunked_content_provider(ours.content_type, [fn = std::move(ours.stream)](size_t, httplib::DataSink& sink) {
    HttplibSink s(sink);
    fn(s);
    if (s.failed()) return false;
    sink.done();
    return true;
  });
}

}  // namespace

Server::Server(Engine& engine, std::shared_ptr<const text::Tokenizer> tok, std::shared_ptr<const ChatFormat> chat,
               ServerOptions opt) {
  opt.web_dir = find_web_dir(opt.web_dir);
  sched_ = std::make_unique<Scheduler>(engine, opt.sched);
  core_ = std::make_unique<Core>(engine, std::move(tok), std::move(chat), std::move(opt), *sched_);
  register_apis(*core_);
  const ServerOptions& o = core_->opt;

  http_ = std::make_unique<httplib::Server>();
  auto& h = *http_;
  const size_t threads = size_t(std::max(16, o.sched.parallel + o.sched.max_queue + 8));
  h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  h.set_payload_max_length(o.max_body_bytes);
  h.set_keep_alive_timeout(30);
  h.set_read_timeout(60);
  h.set_write_timeout(30);
  h.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  if (!o.web_dir.empty()) h.set_mount_point("/", o.web_dir);

  Core* core = core_.get();
  h.set_pre_routing_handler([core](const httplib::Request& req, httplib::Response& res) {
    HttpResponse out;
    if (!core->screen(from_httplib(req, false), out)) return httplib::Server::HandlerResponse::Unhandled;
    to_httplib(out, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  auto dispatch = [core](const httplib::Request& req, httplib::Response& res) {
    HttpRequest in = from_httplib(req, true);
    HttpResponse out;
    core->dispatch(in, out);
    to_httplib(out, res);
  };
  h.Get(".*", dispatch);
  h.Post(".*", dispatch);
  h.Put(".*", dispatch);
  h.Patch(".*", dispatch);
  h.Delete(".*", dispatch);
  h.set_error_handler(httplib::Server::HandlerWithResponse([core](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = res.status;
    if (res.status == 413) {
      e.message = "The request body is too large";
      e.code = "request_too_large";
    } else if (res.status == 400) {
      e.message = "Malformed HTTP request";
    } else {
      e.message = fmt::format("HTTP error {}", res.status);
      e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
    }
    HttpResponse out;
    core->refuse(from_httplib(req, false), out, e);
    to_httplib(out, res);
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_logger([core](const httplib::Request&, const httplib::Response& res) { core->record_status(res.status); });
}

Server::~Server() { stop(); }

int Server::bind() {
  const auto& o = core_->opt;
  if (o.port == 0) {
    port_ = http_->bind_to_any_port(o.host);
  } else {
    port_ = http_->bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (port_ <= 0) fail("cannot listen on {}:{} (address in use, or not a local address)", o.host, o.port);
  return port_;
}

void Server::listen() { http_->listen_after_bind(); }

void Server::start() {
  bind();
  thread_ = std::thread([this] { listen(); });
  for (int i = 0; i < 500 && !http_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void Server::stop() {
  // Generation ends first, so that streams close and the HTTP threads are free to finish.
  if (sched_) sched_->stop();
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace lily::server
