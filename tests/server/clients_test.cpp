// Real clients against the server: the `lily serve` binary, the official openai (chat completions,
// Responses) and @anthropic-ai/sdk (Messages) npm SDKs, and the chat page in headless Chromium.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "api_fixture.h"
#include "serve_process.h"

namespace lily::server::test {
namespace {

namespace fs = std::filesystem;

int run(const std::string& cmd, std::string& out) { return run_command(cmd, out); }

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
  std::printf("%s: %s", script.c_str(), out.c_str());  // what the SDK saw, for the log
}

TEST(Clients, AnthropicNpmSdk) {
  NEED_DEMO();
  run_sdk_script(demo->port(), "anthropic_sdk.mjs", "@anthropic-ai/sdk", "");
}

TEST(Clients, OpenAiResponsesNpmSdk) {
  NEED_DEMO();
  run_sdk_script(demo->port(), "openai_responses.mjs", "openai", "/v1");
}

// The SDKs on a reply with reasoning and tool calls, one of them inside the think block (the scripted
// demo server).
TEST(Clients, AnthropicNpmSdkOnThinkingAndToolCalls) {
  NEED_SCRIPTED();
  sd->script(kThinkAndCallsScript);
  run_sdk_script(sd->port(), "anthropic_sdk.mjs", "@anthropic-ai/sdk", " --scripted");
}

TEST(Clients, OpenAiResponsesNpmSdkOnThinkingAndToolCalls) {
  NEED_SCRIPTED();
  sd->script(kThinkAndCallsScript);
  run_sdk_script(sd->port(), "openai_responses.mjs", "openai", "/v1 --scripted");
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
  if (!fs::exists(lily_binary())) GTEST_SKIP() << "no lily binary at " << lily_binary();
  ServeProcess srv({"--model", golden_dir("qwen3_5_moe_text-a"), "--ctx-size", "1024", "--parallel", "2", "--cache-mem", "64"});
  ASSERT_GT(srv.port(), 0) << "lily serve did not start: " << srv.output();
  const int port = srv.port();
  auto c = client(port);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  json r = post_json(port, "/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 3}, {"temperature", 0}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 3) << r.dump();
  EXPECT_EQ(json::parse(c.Get("/v1/models")->body)["data"][0]["id"], "qwen3_5_moe_text-a");
  EXPECT_EQ(srv.stop(), 0);
}

}  // namespace
}  // namespace lily::server::test
