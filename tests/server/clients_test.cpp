// Real clients against the server: the `lily serve` binary, the official openai (chat completions,
// Responses) and @anthropic-ai/sdk (Messages) npm SDKs, and the chat page in headless Chromium.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <regex>

#include <fmt/format.h>

#include "server_fixture.h"

namespace lily::server::test {
namespace {

namespace fs = std::filesystem;

// Runs a shell command, returns its exit status and output (stdout + stderr).
int run(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool have(const std::string& prog) {
  std::string out;
  return run("command -v " + prog, out) == 0;
}

TEST(Clients, OpenAiNpmSdk) {
  NEED_DEMO();
  const fs::path dir = fs::path(LILY_SOURCE_DIR) / "tests/server";
  if (!have("node") || !fs::exists(dir / "node_modules/openai/package.json"))
    GTEST_SKIP() << "node or the openai npm package is missing (scripts/fetch-assets.sh installs it)";
  std::string out;
  int rc = run(fmt::format("cd '{}' && timeout 120 node openai_sdk.mjs http://127.0.0.1:{}/v1 lily-demo", dir.string(), demo->port()), out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ok:"), std::string::npos) << out;
}

// The official SDKs of the other two APIs: @anthropic-ai/sdk (Messages) and openai (Responses).
void run_sdk_script(int port, const std::string& script, const std::string& package, const std::string& base) {
  const fs::path dir = fs::path(LILY_SOURCE_DIR) / "tests/server";
  if (!have("node") || !fs::exists(dir / "node_modules" / package / "package.json"))
    GTEST_SKIP() << "node or the " << package << " npm package is missing (scripts/fetch-assets.sh installs it)";
  std::string out;
  int rc = run(fmt::format("cd '{}' && timeout 300 node {} http://127.0.0.1:{}{}", dir.string(), script, port, base), out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ok:"), std::string::npos) << out;
}

TEST(Clients, AnthropicNpmSdk) {
  NEED_DEMO();
  run_sdk_script(demo->port(), "anthropic_sdk.mjs", "@anthropic-ai/sdk", "");
}

TEST(Clients, OpenAiResponsesNpmSdk) {
  NEED_DEMO();
  run_sdk_script(demo->port(), "openai_responses.mjs", "openai", "/v1");
}

TEST(Clients, ChatPageStreamsInHeadlessChromium) {
  NEED_DEMO();
  std::string browser = have("chromium") ? "chromium" : have("chromium-browser") ? "chromium-browser" : "";
  if (browser.empty()) GTEST_SKIP() << "chromium is not installed";
  auto c = client(demo->port());
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  ASSERT_NE(page->body.find("/v1/chat/completions"), std::string::npos);
  char tmpl[] = "/tmp/lily-chromium-XXXXXX";
  ASSERT_TRUE(mkdtemp(tmpl));
  std::string out;
  // The page sends ?q= on load; the script watches the answer through the DevTools protocol.
  int rc = run(fmt::format("cd '{}' && timeout 90 node chromium_page.mjs {} 'http://127.0.0.1:{}/?q=Hello%20there&max_tokens=40' {}",
                           (fs::path(LILY_SOURCE_DIR) / "tests/server").string(), browser, demo->port(), tmpl),
               out);
  std::string rm;
  run(fmt::format("rm -rf '{}'", tmpl), rm);
  ASSERT_EQ(rc, 0) << out;
  size_t at = out.rfind("RESULT ");
  ASSERT_NE(at, std::string::npos) << out;
  size_t eol = out.find('\n', at);
  json r = json::parse(out.substr(at + 7, eol == std::string::npos ? std::string::npos : eol - at - 7), nullptr, false);
  ASSERT_TRUE(r.is_object()) << out;
  EXPECT_TRUE(r["done"].get<bool>()) << out;
  EXPECT_FALSE(r["error"].get<bool>()) << out;
  EXPECT_FALSE(r["content"].get<std::string>().empty()) << out;
  EXPECT_GE(r["chunks"].get<int>(), 2) << "the answer should arrive in several streamed pieces: " << out;
}

TEST(Clients, LilyServeBinary) {
  const char* bin = std::getenv("LILY_BIN");
  std::string lily = bin ? bin : std::string(LILY_BINARY_DIR) + "/lily";
  if (!fs::exists(lily)) GTEST_SKIP() << "no lily binary at " << lily;
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    std::string model = golden_dir("qwen3_5_moe_text-a");
    execl(lily.c_str(), lily.c_str(), "serve", "--model", model.c_str(), "--port", "0", "--ctx-size", "1024",
          "--parallel", "2", "--cache-mem", "64", (char*)nullptr);
    _exit(127);
  }
  close(pipefd[1]);
  std::string out;
  int port = 0;
  char buf[512];
  std::regex re(R"(listening on http://127\.0\.0\.1:(\d+))");
  for (int i = 0; i < 200 && port == 0; ++i) {
    ssize_t n = read(pipefd[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
    std::smatch m;
    if (std::regex_search(out, m, re)) port = std::stoi(m[1]);
  }
  close(pipefd[0]);
  if (port == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    FAIL() << "lily serve did not start: " << out;
  }
  auto c = client(port);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  json r = post_json(port, "/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 3}, {"temperature", 0}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 3) << r.dump();
  EXPECT_EQ(json::parse(c.Get("/v1/models")->body)["data"][0]["id"], "qwen3_5_moe_text-a");
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "exit status " << st;
}

}  // namespace
}  // namespace lily::server::test
