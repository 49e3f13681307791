#include "server/static_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "text/utf8.h"

namespace lily::server {

namespace {

const char* mime_type(const std::string& ext) {
  if (ext == ".html" || ext == ".htm") return "text/html; charset=utf-8";
  if (ext == ".js" || ext == ".mjs") return "text/javascript; charset=utf-8";
  if (ext == ".css") return "text/css; charset=utf-8";
  if (ext == ".json") return "application/json";
  if (ext == ".svg") return "image/svg+xml";
  if (ext == ".png") return "image/png";
  if (ext == ".ico") return "image/x-icon";
  if (ext == ".txt") return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

[[noreturn]] void not_found(const HttpRequest& req) {
  throw ApiError{404, fmt::format("Unknown route: GET {}", text::utf8_sanitize(req.path)), "invalid_request_error", "", "not_found"};
}

}  // namespace

void register_static_files(Core& core, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path root = dir.empty() ? fs::path() : fs::canonical(dir, ec);
  if (dir.empty() || ec) root.clear();
  auto serve = [root](const HttpRequest& req, HttpResponse& res) {
    if (root.empty()) not_found(req);
    std::string rel = req.path == "/" ? "index.html" : req.path.substr(1);
    if (rel.empty() || rel.find('\0') != std::string::npos || rel.find('\\') != std::string::npos) not_found(req);
    for (const auto& part : fs::path(rel))
      if (part == ".." || part == ".") not_found(req);
    std::error_code e;
    fs::path p = fs::weakly_canonical(root / rel, e);
    auto [r_end, p_it] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
    if (e || r_end != root.end() || !fs::is_regular_file(p, e) || fs::file_size(p, e) > (size_t(64) << 20)) not_found(req);
    std::ifstream f(p, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    if (!f) not_found(req);
    res.set(ss.str(), mime_type(p.extension().string()));
    res.headers.set("Cache-Control", "no-cache");
  };
  RouteOptions o;
  o.open = true;
  o.json_body = false;
  core.route("GET", "/", serve, o);
  core.route("GET", "/*", serve, o);
}

}  // namespace lily::server
