// `--spec` / `--spec-depth` on the command line (cli/spec_options.h): `lily generate` with speculation
// prints the plain tokens and its statistics; bad values and `--spec mtp` on a model without the MTP
// block end with `error: ...` naming the cause and exit code 2; `lily bench --spec` prints JSON.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "../support/lily_cli.h"

namespace {

using namespace lily;
namespace fs = std::filesystem;


using lily::test::golden_dir;
using lily::test_support::kPromptTokens;
using lily::test_support::run_lily;


TEST(SpecCli, GenerateWithSpeculationGivesThePlainTokens) {
  LILY_REQUIRE_BIN_OR_SKIP();
  const std::string m = golden_dir("qwen3_next-a-mtp");
  std::string plain, spec, ngram;
  ASSERT_EQ(run_lily("generate --json --max-tokens 12 --model " + m + " " + kPromptTokens, plain, false), 0) << plain;
  ASSERT_EQ(run_lily("generate --json --max-tokens 12 --spec mtp --spec-depth 3 --model " + m + " " + kPromptTokens, spec, false), 0) << spec;
  ASSERT_EQ(run_lily("generate --json --max-tokens 12 --spec ngram --model " + m + " " + kPromptTokens, ngram, false), 0) << ngram;
  auto a = nlohmann::json::parse(plain), b = nlohmann::json::parse(spec), c = nlohmann::json::parse(ngram);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["tokens"], c["tokens"]);
  EXPECT_FALSE(a.contains("spec"));
  EXPECT_EQ(b["spec"]["mode"], "mtp");
  EXPECT_GT(b["spec"]["rounds"].get<int>(), 0);
  EXPECT_EQ(c["spec"]["mode"], "ngram");
}

TEST(SpecCli, BadValuesExit2NamingTheCause) {
  LILY_REQUIRE_BIN_OR_SKIP();
  const std::string m = golden_dir("qwen3_5_moe_text-a-mtp"), plain = golden_dir("qwen3_next-a");
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"generate --spec mtp --model " + plain + " " + kPromptTokens, "mtp.fc.weight"},
                        Case{"generate --spec-depth 0 --spec ngram --model " + m + " " + kPromptTokens, "--spec-depth"},
                        Case{"generate --spec-depth 17 --spec mtp --model " + m + " " + kPromptTokens, "1..16"},
                        Case{"generate --spec eagle --model " + m + " " + kPromptTokens, "--spec"},
                        Case{"bench --synth tiny --spec mtp --spec-depth 0", "--spec-depth"},
                        Case{"bench --synth tiny --spec mtp --acceptance 2", "--acceptance"},
                        Case{"bench --synth tiny --acceptance 0.5", "--spec"},
                        Case{"bench --spec mtp --model " + plain, "mtp.fc.weight"}}) {
    std::string out;
    EXPECT_EQ(run_lily(c.args, out), 2) << c.args << "\n" << out;
    EXPECT_NE(out.find("error: "), std::string::npos) << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << c.args << "\n" << out;
  }
}

TEST(SpecCli, BenchPrintsJson) {
  LILY_REQUIRE_BIN_OR_SKIP();
  std::string out;
  ASSERT_EQ(run_lily("bench --synth tiny --format affine4 --prefill 8 --decode-context 8 --repeats 1 --decode-tokens 6 "
                 "--stream-context 24 --spec mtp --acceptance 0.86 --spec-depth 3 --json",
                 out, false),
            0)
      << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["spec"]["rows"][0]["acceptance"], 0.86);
  EXPECT_EQ(j["spec"]["round_costs"].size(), 7u);
  EXPECT_EQ(j["spec"]["auto_picks"].size(), 4u);
}

}  // namespace
