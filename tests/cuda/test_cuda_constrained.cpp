// Structured outputs on the CUDA device path: a request under a grammar constraint has its allowed-id mask
// uploaded before each device draw (Backend::set_mask). On a golden model with a JSON-piece vocabulary over
// its ids: greedy runs draw the host path's tokens on the same backend; sampled runs reproduce with their
// seed; every output walks the grammar and is a complete document followed by the end id.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaConstrained, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <iterator>

#include <nlohmann/json.hpp>

#include "../model/test_util.h"
#include "core/mapped_file.h"
#include "cuda_test_util.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/grammar_constraint.h"
#include "runtime/session.h"
#include "text/json_grammar.h"
#include "text/token_grammar.h"

using namespace lily;
using json = nlohmann::ordered_json;

namespace {

// The model's ids as text: the 256 bytes, then JSON pieces that span grammar symbols; the last id is
// the end id (no text).
std::shared_ptr<const text::TokenVocabulary> json_vocab(int32_t n) {
  std::vector<std::string> b;
  for (int c = 0; c < 256; ++c) b.push_back(std::string(1, char(c)));
  const char* pieces[] = {"{\"", "\":", "\": ", "\"}", "\",\"", "\", \"", "true", "false", "null", "[]", ", ",
                          "12", "-1", "\"a\"", "name", "\"name\": \"", "ok", "\"ok\":", "tags", "\"]", "[\"", "}\n"};
  for (size_t i = 0; int32_t(b.size()) < n - 1; ++i) b.push_back(pieces[i % std::size(pieces)]);
  b.push_back("");
  return std::make_shared<text::TokenVocabulary>(std::move(b));
}

struct Constrained {
  GenerateResult r;
  std::string text;
  bool complete = false;
};

Constrained run(Engine& e, const std::vector<int32_t>& prompt, GenerateOptions go, std::shared_ptr<text::TokenGrammar> g, bool device) {
  go.allow_device = device;
  go.constraint = std::make_shared<GrammarConstraint>(g, go.max_tokens);
  Session s(e);
  Constrained o;
  o.r = generate(s, prompt, go);
  auto st = g->start();
  for (int32_t t : o.r.tokens) {
    if (g->is_end(t)) break;
    st = g->advance(st, t);
    EXPECT_NE(st, text::TokenGrammar::kDead) << "token " << t << " after " << o.text;
    if (st == text::TokenGrammar::kDead) return o;
    o.text += g->vocab().bytes(t);
  }
  o.complete = g->accepting(st) && !o.r.tokens.empty() && g->is_end(o.r.tokens.back());
  return o;
}

TEST(CudaConstrained, DevicePathDrawsUnderTheMask) {
  LILY_REQUIRE_GPU();
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  if (dir.empty()) GTEST_SKIP() << "golden model not present";
  EngineOptions eo;
  eo.backend = "cuda";
  eo.ctx_size = 256;
  auto e = Engine::open(dir, eo);
  const int32_t V = int32_t(e->config().vocab);
  auto ids = json::parse(read_text_file(dir + "/golden.json"))["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 16);
  const int32_t end = V - 1;
  auto g = std::make_shared<text::TokenGrammar>(
      text::json_schema_grammar(json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "ok"]})"), "schema"),
      json_vocab(V), std::vector<int32_t>{end});
  GenerateOptions go;
  go.max_tokens = 40;
  go.stop_ids = {end};
  go.use_cache = false;

  const Constrained dev = run(*e, prompt, go, g, true), host = run(*e, prompt, go, g, false);
  EXPECT_TRUE(dev.r.device_sampled);
  EXPECT_FALSE(host.r.device_sampled);
  EXPECT_EQ(dev.r.tokens, host.r.tokens) << "greedy under the mask: " << dev.text << " vs " << host.text;
  EXPECT_TRUE(dev.complete) << dev.text;
  EXPECT_TRUE(json::accept(dev.text)) << dev.text;

  go.sampling.temperature = 1.0f;
  go.sampling.top_k = 20;
  for (uint64_t seed : {1, 2, 3, 4}) {
    go.sampling.seed = seed;
    const Constrained a = run(*e, prompt, go, g, true), b = run(*e, prompt, go, g, true);
    EXPECT_TRUE(a.r.device_sampled);
    EXPECT_EQ(a.r.tokens, b.r.tokens) << "same seed, same tokens";
    EXPECT_TRUE(a.complete) << "seed " << seed << ": " << a.text;
    const json doc = json::parse(a.text, nullptr, false);
    EXPECT_TRUE(doc.is_object() && doc.contains("name") && doc["name"].is_string() && doc.contains("ok") &&
                doc["ok"].is_boolean())
        << a.text;
  }
}

}  // namespace
#endif
