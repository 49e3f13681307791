// The MTP head's CPU reference against the golden MTP logits and draft chains (tests/data/golden/*-mtp,
// made with HF's own classes wired as model doc §5 describes), and `lily logits --mtp`.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "backend/cpu/mtp_reference.h"
#include "core/mapped_file.h"
#include "runtime/engine.h"
#include "../support/lily_cli.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lily;

namespace {

struct MtpGolden {
  std::vector<int32_t> prompt, greedy, chain;
  int64_t prefix = 0;
  std::vector<float> logits;  // [T-1, V]
};

MtpGolden read_mtp_golden(const std::string& dir) {
  auto j = nlohmann::json::parse(read_text_file(dir + "/golden.json"));
  MtpGolden g;
  g.prompt = j["prompt_ids"].get<std::vector<int32_t>>();
  g.greedy = j["greedy_ids"].get<std::vector<int32_t>>();
  g.chain = j["mtp"]["chain"].get<std::vector<int32_t>>();
  g.prefix = j["mtp"]["chain_prefix_len"].get<int64_t>();
  EXPECT_EQ(j["mtp"]["chain_first_token"].get<int32_t>(), g.greedy[0]);
  g.logits = test::read_f32(dir + "/mtp_logits.f32");
  return g;
}

// Main-model states after the final norm for `ids`, from the CPU backend in steps of `chunk`.
std::vector<float> hidden_of(Engine& e, const std::vector<int32_t>& ids, int64_t chunk) {
  auto& be = dynamic_cast<cpu::CpuBackend&>(e.backend());
  auto st = be.new_state(int64_t(ids.size()));
  return cpu::final_hidden_states(be, *st, ids, chunk, nullptr);
}

std::unique_ptr<Engine> open(const std::string& dir) {
  EngineOptions eo;
  eo.ctx_size = 256;
  return Engine::open(dir, eo);
}

class MtpGoldenModel : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return test::golden_dir(GetParam()); }
};

// max |Δ| ≤ 1e-3 × RMS of the reference; argmax equal wherever the reference's top-2 gap exceeds the
// tolerance (a near-tie may flip under float reordering).
void expect_close(const std::vector<float>& ours, const std::vector<float>& ref, int64_t V, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  double ss = 0, maxd = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ss += double(ref[i]) * ref[i];
    maxd = std::max(maxd, double(std::fabs(ours[i] - ref[i])));
  }
  const double rms = std::sqrt(ss / double(ref.size())), tol = 1e-3 * rms;
  EXPECT_LE(maxd, tol) << what << ": max |dlogit| " << maxd << " rms " << rms;
  const int64_t T = int64_t(ref.size()) / V;
  int ties = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* r = ref.data() + t * V;
    std::vector<float> sorted(r, r + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] <= 2 * tol) {
      ++ties;
      continue;
    }
    EXPECT_EQ(test::argmax(ours.data() + t * V, V), test::argmax(r, V)) << what << " row " << t;
  }
  EXPECT_LE(ties, 2) << what;
  std::printf("%s: max |dlogit| / RMS = %.2e over %lld rows (%d near-ties)\n", what.c_str(), maxd / rms, (long long)T, ties);
}

TEST_P(MtpGoldenModel, TeacherForcedLogitsMatchReference) {
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not present";
  auto g = read_mtp_golden(dir());
  auto e = open(dir());
  auto h = hidden_of(*e, g.prompt, 2048);
  auto ours = cpu::mtp_teacher_forced(e->weights(), g.prompt, h.data());
  expect_close(ours, g.logits, e->config().vocab, GetParam());
}

TEST_P(MtpGoldenModel, GreedyDraftChainMatches) {
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not present";
  auto g = read_mtp_golden(dir());
  auto e = open(dir());
  std::vector<int32_t> prefix(g.prompt.begin(), g.prompt.begin() + g.prefix);
  auto h = hidden_of(*e, prefix, 2048);
  prefix.push_back(g.greedy[0]);  // the verified token after the prefix
  EXPECT_EQ(cpu::mtp_greedy_draft(e->weights(), prefix, h.data(), int64_t(g.chain.size())), g.chain);
}

// The MTP layer's cache: pairs absorbed in pieces give the rows of one whole step; the main model's
// states do not depend on its prefill chunk.
TEST_P(MtpGoldenModel, StepsInPiecesEqualOneStep) {
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not present";
  auto g = read_mtp_golden(dir());
  auto e = open(dir());
  const auto& w = e->weights();
  const int64_t H = w.cfg.hidden, V = w.cfg.vocab, T = int64_t(g.prompt.size()) - 1;
  auto h = hidden_of(*e, g.prompt, 2048);
  auto h7 = hidden_of(*e, g.prompt, 7);
  double dh = 0;
  for (size_t i = 0; i < h.size(); ++i) dh = std::max(dh, double(std::fabs(h[i] - h7[i])));
  EXPECT_LE(dh, 1e-4);
  auto whole = cpu::mtp_teacher_forced(w, g.prompt, h.data());
  std::span<const int32_t> next(g.prompt.data() + 1, size_t(T));
  for (int64_t piece : {1, 5, 64}) {
    cpu::MtpReference m(w);
    std::vector<float> part(static_cast<size_t>(T * V));
    for (int64_t b = 0; b < T; b += piece) {
      const int64_t n = std::min(piece, T - b);
      m.step(next.subspan(size_t(b), size_t(n)), h.data() + b * H, nullptr, part.data() + b * V);
    }
    EXPECT_EQ(m.n_tokens(), T);
    double d = 0;
    for (size_t i = 0; i < whole.size(); ++i) d = std::max(d, double(std::fabs(whole[i] - part[i])));
    EXPECT_LE(d, 1e-4) << "pieces of " << piece;
  }
}

using lily::test_support::run_lily;

TEST_P(MtpGoldenModel, CliWritesMtpLogits) {
  LILY_REQUIRE_BIN_OR_SKIP();
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not present";
  auto g = read_mtp_golden(dir());
  std::string ids;
  for (auto t : g.prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const auto out = fs::temp_directory_path() / ("lily_mtp_cli_" + std::to_string(::getpid()) + ".f32");
  std::string log;
  ASSERT_EQ(run_lily("logits --mtp --prefill-chunk 64 --model " + dir() + " --tokens " + ids + " --out " + out.string(), log), 0)
      << log;
  auto got = test::read_f32(out.string());
  fs::remove(out);
  expect_close(got, g.logits, int64_t(g.logits.size()) / int64_t(g.prompt.size() - 1), GetParam() + " (lily logits --mtp)");
}

TEST_P(MtpGoldenModel, InfoShowsTheBlock) {
  LILY_REQUIRE_BIN_OR_SKIP();
  if (dir().empty()) GTEST_SKIP() << GetParam() << " not present";
  std::string out;
  ASSERT_EQ(run_lily("info --json --model " + dir(), out, false), 0) << out;
  auto j = nlohmann::json::parse(out)["mtp"];
  EXPECT_TRUE(j["present"].get<bool>());
  EXPECT_EQ(j["prefix"], "mtp.");
  // fc [128, 256] + attention + the block's FFN, all bf16: the MoE goldens' router, shared gate, 8 + 1
  // experts; the dense golden's SwiGLU of intermediate 256
  const bool dense = GetParam() == "qwen3_5_text-a-mtp";
  const std::string ffn = dense ? "dense MLP" : "MoE 8 experts";
  EXPECT_EQ(j["ffn"], ffn);
  // fc, q/k/v/o, then router + shared gate, shared expert, experts (MoE) or gate/up/down (dense)
  EXPECT_EQ(j["formats"]["dense"], dense ? 1 + 4 + 3 : 1 + 4 + 2 + 3 + 8 * 3);
  const int64_t attn = 4 * 128 * 128 + 2 * 2 * 64 * 128 + 128 * 4 * 64;
  const int64_t ffn_w = dense ? 3 * 256 * 128 : 8 * 128 + 128 + 8 * 3 * 64 * 128 + 3 * 96 * 128;
  EXPECT_EQ(j["weight_bytes"], 2 * (128 * 256 + attn + ffn_w));
  std::string text;
  ASSERT_EQ(run_lily("info --model " + dir(), text, false), 0);
  EXPECT_NE(text.find("mtp            1 layer (dense attention, " + ffn + ")"), std::string::npos) << text;
  std::string plain;
  ASSERT_EQ(run_lily("info --json --model " + test::golden_dir("qwen3_next-a"), plain, false), 0);
  EXPECT_FALSE(nlohmann::json::parse(plain)["mtp"]["present"].get<bool>());
}

INSTANTIATE_TEST_SUITE_P(Golden, MtpGoldenModel,
                         ::testing::Values("qwen3_5_moe_text-a-mtp", "qwen3_next-a-mtp", "qwen3_5_text-a-mtp"),
                         test::ModelParamName());

}  // namespace
