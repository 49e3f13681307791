#include <algorithm>
#include <cstdio>
#include <map>

#include <fmt/format.h>

#include "cli/registry.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace lily::cli {

std::vector<Command>& commands() {
  static std::vector<Command> c;
  return c;
}

std::vector<int32_t> parse_ids(const std::string& s, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || std::isspace(static_cast<unsigned char>(s[i])))) ++i;
    if (i >= s.size()) break;
    size_t j = i;
    while (j < s.size() && s[j] != ',' && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end != tok.c_str() + tok.size() || tok.empty() || v < 0 || v > INT32_MAX)
      fail("{}: '{}' is not a token id (expected non-negative integers separated by commas)", what, tok);
    ids.push_back(int32_t(v));
    i = j;
  }
  return ids;
}

}  // namespace lily::cli

int main(int argc, char** argv) {
  using namespace lily;
  CLI::App app{"lily: inference engine for Qwen hybrid sparse MoE models (Qwen3.5-MoE, Qwen3-Next)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("lily 0.1.0"));
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads (default: all cores)");
  auto& cmds = cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::map<CLI::App*, cli::Runner> runners;
  for (auto& c : cmds) {
    auto* sub = app.add_subcommand(c.name, c.help);
    runners[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (threads > 0) ThreadPool::set_global_threads(threads);
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const InputError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "internal error: {}\n", e.what());
    return 3;
  }
  return 1;
}
