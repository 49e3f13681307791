// The sampling flags of `lily generate` and `lily chat` (cli/sampling_options.h): a value out of range
// ends with `error: ...` naming the flag as typed and exit code 2; a seed makes sampling repeatable;
// both commands list the same flags.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "../support/lily_cli.h"

namespace {

using lily::test::golden_dir;
using lily::test_support::run_lily;


const char* kShortPrompt = "--tokens 5,17,101,33,250,7,9,81";

TEST(SamplingCli, OutOfRangeValuesExit2NamingTheFlag) {
  LILY_REQUIRE_BIN_OR_SKIP();
  const std::string g = "generate --max-tokens 2 --model " + golden_dir("qwen3_next-a") + " " + kShortPrompt + " ";
  struct Case {
    std::string flag, says;
  };
  for (const Case& c : {Case{"--temperature -1", "--temperature must be >= 0"}, Case{"--top-k -1", "--top-k must be >= 0"},
                        Case{"--top-p 1.5", "--top-p must be in (0, 1]"}, Case{"--top-p 0", "--top-p"},
                        Case{"--min-p 2", "--min-p must be in [0, 1]"}, Case{"--repeat-penalty 0", "--repeat-penalty must be > 0"},
                        Case{"--presence-penalty 3", "--presence-penalty must be in [-2, 2]"},
                        Case{"--frequency-penalty -2.5", "--frequency-penalty must be in [-2, 2]"}}) {
    std::string out;
    EXPECT_EQ(run_lily(g + c.flag, out), 2) << c.flag << "\n" << out;
    EXPECT_NE(out.find("error: " + c.says), std::string::npos) << c.flag << "\n" << out;
  }
}

TEST(SamplingCli, ASeedRepeatsTheDrawAndPenaltiesAreAccepted) {
  LILY_REQUIRE_BIN_OR_SKIP();
  const std::string g = "generate --json --max-tokens 12 --model " + golden_dir("qwen3_next-a") + " " + kShortPrompt +
                        " --temperature 1.2 --top-p 0.95 --presence-penalty 0.5 --frequency-penalty 0.25 --repeat-penalty 1.1 ";
  std::string a, b;
  ASSERT_EQ(run_lily(g + "--seed 7", a, false), 0) << a;
  ASSERT_EQ(run_lily(g + "--seed 7", b, false), 0) << b;
  auto ja = nlohmann::json::parse(a), jb = nlohmann::json::parse(b);
  ASSERT_EQ(ja["tokens"].size(), 12u);
  EXPECT_EQ(ja["tokens"], jb["tokens"]);
}

TEST(SamplingCli, GenerateAndChatListTheSameFlags) {
  LILY_REQUIRE_BIN_OR_SKIP();
  std::string gen, chat;
  ASSERT_EQ(run_lily("generate --help", gen), 0);
  ASSERT_EQ(run_lily("chat --help", chat), 0);
  for (const char* f : {"--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--presence-penalty",
                        "--frequency-penalty", "--seed"}) {
    EXPECT_NE(gen.find(f), std::string::npos) << f;
    EXPECT_NE(chat.find(f), std::string::npos) << f;
  }
  EXPECT_NE(chat.find("--temperature FLOAT=0.7"), std::string::npos) << "chat keeps its own defaults";
}

}  // namespace
