// `--devices` on the command line (EngineOptions::devices, model/shard.h): `lily generate` / `logits` /
// `bench` over N CPU ranks give the unsplit model's tokens and logits (speculation included), `lily info
// --devices N` prints each rank's share, and bad values end with `error: ...` naming the cause and exit 2.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "../support/lily_cli.h"

namespace {

using lily::test::golden_dir;
using lily::test_support::kPromptTokens;
using lily::test_support::run_lily;
namespace fs = std::filesystem;



std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(size_t(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
  return v;
}

}  // namespace

TEST(DevicesCli, SplitRunsGiveTheUnsplitTokensAndLogits) {
  LILY_REQUIRE_BIN_OR_SKIP();
  const std::string m = golden_dir("qwen3_5_moe_text-a-mtp");
  std::string plain, split, spec;
  ASSERT_EQ(run_lily("generate --json --max-tokens 16 --model " + m + " " + kPromptTokens, plain, false), 0) << plain;
  ASSERT_EQ(run_lily("generate --json --max-tokens 16 --devices 2 --model " + m + " " + kPromptTokens, split, false), 0) << split;
  ASSERT_EQ(run_lily("generate --json --max-tokens 16 --devices 4 --spec mtp --spec-depth 3 --model " + m + " " + kPromptTokens, spec,
                     false), 0) << spec;
  auto a = nlohmann::json::parse(plain), b = nlohmann::json::parse(split), c = nlohmann::json::parse(spec);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["tokens"], c["tokens"]);
  EXPECT_GT(c["spec"]["rounds"].get<int>(), 0);

  const fs::path dir = fs::temp_directory_path() / ("lily-devices-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string out;
  ASSERT_EQ(run_lily("logits --model " + m + " " + kPromptTokens + " --out " + (dir / "a.f32").string(), out), 0) << out;
  ASSERT_EQ(run_lily("logits --devices 4 --model " + m + " " + kPromptTokens + " --out " + (dir / "b.f32").string(), out), 0) << out;
  const auto la = read_f32((dir / "a.f32").string()), lb = read_f32((dir / "b.f32").string());
  ASSERT_EQ(la.size(), lb.size());
  double ss = 0, mx = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    ss += double(la[i]) * la[i];
    mx = std::max(mx, std::fabs(double(la[i]) - lb[i]));
  }
  EXPECT_LE(mx / std::sqrt(ss / double(la.size())), 5e-5);
  fs::remove_all(dir);
}

TEST(DevicesCli, InfoPrintsEachRanksShare) {
  LILY_REQUIRE_BIN_OR_SKIP();
  std::string out;
  ASSERT_EQ(run_lily("info --json --devices 4 --model " + golden_dir("qwen3_5_moe_text-a"), out, false), 0) << out;
  const auto j = nlohmann::json::parse(out)["devices"];
  EXPECT_EQ(j["ranks"], 4);
  ASSERT_EQ(j["per_rank"].size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const auto& p = j["per_rank"][size_t(r)];
    EXPECT_EQ(p["experts"], nlohmann::json::array({2 * r, 2 * r + 2}));
    EXPECT_EQ(p["query_heads"], nlohmann::json::array({r, r + 1}));
    EXPECT_GT(p["weight_bytes"].get<size_t>(), 0u);
  }
  out.clear();
  ASSERT_EQ(run_lily("info --devices 2 --model " + golden_dir("qwen3_5_moe_text-a"), out), 0) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  // the 397B-A17B shape in affine 4-bit, shapes only: about 223 GB, a quarter of it (and the replicated
  // embedding and routers) a rank on 4
  out.clear();
  ASSERT_EQ(run_lily("info --json --devices 4 --synth qwen3.5-397b-a17b --format affine4", out, false), 0) << out;
  const auto s = nlohmann::json::parse(out);
  const double whole = double(s["weight_bytes"].get<size_t>()) + double(s["mtp"]["weight_bytes"].get<size_t>());
  EXPECT_GT(whole, 215e9);
  EXPECT_LT(whole, 235e9);
  for (const auto& r : s["devices"]["per_rank"]) {
    const double b = double(r["device_bytes"].get<size_t>());
    EXPECT_GT(b, whole / 4);
    EXPECT_LT(b, whole / 4 + 3e9) << r.dump();
  }
}

TEST(DevicesCli, BadValuesExit2NamingTheCause) {
  LILY_REQUIRE_BIN_OR_SKIP();
  const std::string m = golden_dir("qwen3_5_moe_text-a");
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"generate --devices 3 --model " + m + " " + kPromptTokens, "num_attention_heads = 4 is not a multiple of 3"},
                        Case{"generate --devices 0,1 --model " + m + " " + kPromptTokens, "needs --backend cuda"},
                        Case{"generate --devices two --model " + m + " " + kPromptTokens, "--devices"},
                        Case{"logits --devices 0 --model " + m + " " + kPromptTokens + " --out /dev/null", "--devices"},
                        Case{"info --devices 8 --model " + m, "num_attention_heads"},
                        Case{"bench --synth tiny-tp8 --devices 16 --prefill 8 --decode-context 8", "num_attention_heads = 8"}}) {
    std::string out;
    EXPECT_EQ(run_lily(c.args, out), 2) << c.args << "\n" << out;
    EXPECT_NE(out.find("error: "), std::string::npos) << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << c.args << "\n" << out;
  }
}
