#include "server/server.h"

#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "server/anthropic_messages.h"
#include "server/misc_routes.h"
#include "server/openai_chat.h"
#include "server/openai_completions.h"
#include "server/openai_responses.h"
#include "server/static_files.h"

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
  register_static_files(core, core.opt.web_dir);
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

}  // namespace

Server::Server(Engine& engine, std::shared_ptr<const text::Tokenizer> tok, std::shared_ptr<const ChatFormat> chat,
               ServerOptions opt) {
  opt.web_dir = find_web_dir(opt.web_dir);
  LILY_CHECK(opt.max_connections >= 1, "--max-connections must be >= 1 (got {})", opt.max_connections);
  LILY_CHECK(opt.read_timeout_s >= 1 && opt.idle_timeout_s >= 1, "--read-timeout and --idle-timeout must be >= 1 s");
  LILY_CHECK(opt.request_timeout_s >= 0, "--request-timeout must be >= 0 s");
  sched_ = std::make_unique<Scheduler>(engine, opt.sched);
  core_ = std::make_unique<Core>(engine, std::move(tok), std::move(chat), std::move(opt), *sched_);
  register_apis(*core_);
  const ServerOptions& o = core_->opt;
  TransportOptions t;
  t.host = o.host;
  t.port = o.port;
  // Every request holding a slot or a queue place holds a worker; the rest answer everything else.
  t.workers = std::max(16, o.sched.parallel + o.sched.max_queue + 8);
  t.max_connections = o.max_connections;
  t.read_timeout_ms = o.read_timeout_s * 1000;
  t.idle_timeout_ms = o.idle_timeout_s * 1000;
  t.body_bytes = o.max_body_bytes;
  http_ = std::make_unique<HttpServer>(*core_, t);
}

Server::~Server() { stop(); }

int Server::bind() { return port_ = http_->bind(); }

void Server::listen() { http_->run(); }

void Server::start() {
  bind();
  thread_ = std::thread([this] { listen(); });
  for (int i = 0; i < 500 && !http_->running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void Server::stop() {
  // Generation ends first, so that streams close and the HTTP threads are free to finish.
  if (sched_) sched_->stop();
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace lily::server
