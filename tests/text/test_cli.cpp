// The text commands of the lily binary, compared with the same reference data as the library tests.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "common.h"
#include "text/utf8.h"

using namespace lily::text::testing;
using ojson = nlohmann::ordered_json;

namespace {

struct Run {
  int rc;
  std::string out;
};

Run run(const std::string& args, bool with_stderr = false) {
  const char* bin = std::getenv("LILY_BIN");
  std::string cmd = std::string(bin) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  Run r{-1, {}};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string tmp_file(const std::string& name, const std::string& content) {
  auto p = std::filesystem::temp_directory_path() / ("lily_text_cli_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}

std::string q(const std::string& s) { return "'" + s + "'"; }

#define LILY_REQUIRE_BIN()                                                                            \
  do {                                                                                                \
    const char* b = std::getenv("LILY_BIN");                                                          \
    if (!b || !std::filesystem::exists(b)) GTEST_SKIP() << "LILY_BIN not set (ctest sets it)";         \
    LILY_REQUIRE_QWEN3();                                                                             \
  } while (0)

}  // namespace

TEST(Cli, TokenizeMatchesReference) {
  LILY_REQUIRE_BIN();
  auto cases = load_json(data_dir() / "tokenizer_cases.json")["cases"];
  for (size_t k : {size_t(8), size_t(16), size_t(38)}) {
    std::string text = cases[k]["text"];
    auto f = tmp_file("text.txt", text);
    auto r = run("tokenize --tokenizer " + q(qwen3_dir().string()) + " --text-file " + q(f) + " --json");
    ASSERT_EQ(r.rc, 0) << text;
    EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], cases[k]["ids"]) << text;
    std::string ids;
    for (auto& id : cases[k]["ids"]) ids += std::to_string(id.get<int>()) + ",";
    auto d = run("detokenize --tokenizer " + q(qwen3_dir().string()) + " --ids " + ids);
    ASSERT_EQ(d.rc, 0);
    EXPECT_EQ(d.out, lily::text::nfc(text) + "\n");
    std::filesystem::remove(f);
  }
  EXPECT_EQ(run("tokenize --tokenizer /nonexistent --text x").rc, 2);
  EXPECT_EQ(run("detokenize --tokenizer " + q(qwen3_dir().string()) + " --ids 5,x").rc, 2);
}

TEST(Cli, RenderMatchesReference) {
  LILY_REQUIRE_BIN();
  auto cases = load_ojson(data_dir() / "template_cases.json")["chat"];
  int n = 0;
  for (auto& c : cases) {
    if (c["name"] != "qwen3/tool_round" && c["name"] != "qwen3.5-style/tool_in_progress" &&
        c["name"] != "qwen3/single_no_thinking")
      continue;
    ++n;
    std::string args = "render --tokenizer " + q(qwen3_dir().string()) + " --messages-file " +
                       q(tmp_file("m.json", c["messages"].dump()));
    if (!c["tools"].is_null()) args += " --tools-file " + q(tmp_file("t.json", c["tools"].dump()));
    if (c["add_generation_prompt"]) args += " --add-generation-prompt";
    if (!c["kwargs"].empty()) args += " --template-kwargs " + q(c["kwargs"].dump());
    if (c["template"] != "qwen3") args += " --chat-template " + q((data_dir() / "qwen3.5-style.jinja").string());
    auto r = run(args);
    ASSERT_EQ(r.rc, 0) << c["name"];
    EXPECT_EQ(r.out, c["expected"].get<std::string>()) << c["name"];
  }
  EXPECT_EQ(n, 3);
  auto bad = tmp_file("bad.jinja", "{% for x in %}");
  EXPECT_EQ(run("render --tokenizer " + q(qwen3_dir().string()) + " --messages-file " + q(tmp_file("m.json", "[]")) +
                " --chat-template " + q(bad))
                .rc,
            2);
}

TEST(Cli, ChatWithDemoModel) {
  LILY_REQUIRE_BIN();
  auto in = tmp_file("chat.txt", "Hello there\nSecond turn\n/reset\nThird turn\n/exit\n");
  auto r = run("chat --tokenizer " + q(qwen3_dir().string()) + " --max-tokens 4 --ctx-size 2048 --temperature 0 < " + q(in), true);
  EXPECT_EQ(r.rc, 0) << r.out;
  size_t answers = 0;
  for (size_t p = r.out.find("tok/s]"); p != std::string::npos; p = r.out.find("tok/s]", p + 1)) ++answers;
  EXPECT_EQ(answers, 3u) << r.out;
  EXPECT_EQ(r.out.find("<|im_start|>"), std::string::npos) << "special tokens are not printed";
  std::filesystem::remove(in);
}

// --precision (CUDA prompt GEMM operands): a value other than bf16 / high, or the flag on the CPU backend,
// ends with a clear error and exit code 2.
TEST(Cli, PrecisionNeedsCudaAndAKnownMode) {
  const char* b = std::getenv("LILY_BIN");
  if (!b || !std::filesystem::exists(b)) GTEST_SKIP() << "LILY_BIN not set (ctest sets it)";
  auto r = run("bench --synth tiny --format bf16 --precision high --prefill 16 --decode-context 16", true);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("error: --cuda-opt / --precision need --backend cuda"), std::string::npos) << r.out;
  r = run("logits --model /nonexistent --tokens 1,2 --out /dev/null --precision fp8", true);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--precision"), std::string::npos) << r.out;
  r = run("generate --model /nonexistent --tokens 1,2 --precision high", true);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--precision need --backend cuda"), std::string::npos) << r.out;
}
