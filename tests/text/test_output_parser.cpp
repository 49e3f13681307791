#include <random>

#include "common.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

using namespace lily::text;
using namespace lily::text::testing;
using ojson = nlohmann::ordered_json;

namespace {

struct Result {
  std::string content, reasoning;
  ojson calls = ojson::array();
};

OutputParserOptions options(const ojson& c) {
  OutputParserOptions o;
  o.start_in_reasoning = c["start_in_reasoning"];
  o.parse_tool_calls = c["parse_tool_calls"];
  o.tools = c["tools"];
  return o;
}

// Feeds `chunks` and checks that no delta leaks a tag the expected output does not contain.
Result run(const ojson& c, const std::vector<std::string>& chunks) {
  OutputParser p(options(c));
  Result r;
  std::string expected_content = c["expected"]["content"];
  auto take = [&](ParsedDelta d) {
    for (const char* tag : {"<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "</function>"}) {
      if (expected_content.find(tag) == std::string::npos) {
        EXPECT_EQ(d.content.find(tag), std::string::npos) << "tag " << tag << " leaked into content";
      }
      EXPECT_EQ(d.reasoning.find(tag), std::string::npos) << "tag " << tag << " leaked into reasoning";
    }
    r.content += d.content;
    r.reasoning += d.reasoning;
    for (auto& tc : d.tool_calls) r.calls.push_back({{"name", tc.name}, {"arguments", tc.arguments}});
  };
  for (auto& ch : chunks) take(p.feed(ch));
  take(p.finish());
  return r;
}

void check(const ojson& c, const Result& r, const std::string& how) {
  const auto& e = c["expected"];
  EXPECT_EQ(r.content, e["content"].get<std::string>()) << c["name"] << " (" << how << ")";
  EXPECT_EQ(r.reasoning, e["reasoning"].get<std::string>()) << c["name"] << " (" << how << ")";
  EXPECT_EQ(r.calls.dump(), e["tool_calls"].dump()) << c["name"] << " (" << how << ")";
}

ojson corpus() { return load_ojson(data_dir() / "output_corpus.json")["cases"]; }

}  // namespace

TEST(OutputParser, WholeText) {
  auto cases = corpus();
  ASSERT_GT(cases.size(), 20u);
  for (auto& c : cases) check(c, run(c, {c["text"].get<std::string>()}), "one chunk");
}

TEST(OutputParser, EveryTwoChunkSplitAndSingleBytes) {
  for (auto& c : corpus()) {
    std::string text = c["text"];
    for (size_t i = 0; i <= text.size(); ++i) check(c, run(c, {text.substr(0, i), text.substr(i)}), "split at " + std::to_string(i));
    std::vector<std::string> bytes;
    for (char ch : text) bytes.emplace_back(1, ch);
    check(c, run(c, bytes), "byte by byte");
  }
}

TEST(OutputParser, EveryThreeChunkSplitOnShortCases) {
  for (auto& c : corpus()) {
    std::string text = c["text"];
    if (text.size() > 100) continue;
    for (size_t i = 0; i <= text.size(); ++i)
      for (size_t j = i; j <= text.size(); ++j)
        check(c, run(c, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}),
              "split at " + std::to_string(i) + "," + std::to_string(j));
  }
}

TEST(OutputParser, TokenByTokenThroughStreamDecoder) {
  LILY_REQUIRE_QWEN3();
  auto tok = Tokenizer::load(qwen3_dir());
  for (auto& c : corpus()) {
    StreamDecoder sd(tok);
    std::vector<std::string> pieces;
    for (auto id : tok->encode(c["text"].get<std::string>())) pieces.push_back(sd.push(id));
    pieces.push_back(sd.flush());
    check(c, run(c, pieces), "token by token");
  }
}

TEST(OutputParser, Coercion) {
  ojson schema = ojson::parse(R"({"type": "object", "properties": {
      "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"}, "s": {"type": "string"},
      "o": {"type": "object"}, "a": {"type": "array", "items": {"type": "integer"}}, "u": {"type": ["integer", "null"]}}})");
  ojson in = ojson::parse(R"({"i": "12", "n": "2.5", "b": "False", "s": 7, "o": "{'x': 1}", "a": ["1", 2], "u": "None", "extra": "7"})");
  ojson out = coerce_to_schema(in, schema);
  EXPECT_EQ(out["i"], 12);
  EXPECT_EQ(out["n"], 2.5);
  EXPECT_EQ(out["b"], false);
  EXPECT_EQ(out["s"], "7");
  EXPECT_EQ(out["o"], "{'x': 1}");  // not JSON even after literal repair: left as the model wrote it
  EXPECT_EQ(out["a"], ojson::parse("[1, 2]"));
  EXPECT_TRUE(out["u"].is_null());
  EXPECT_EQ(out["extra"], "7");  // not in the schema: unchanged
  EXPECT_EQ(coerce_to_schema("abc", ojson{{"type", "integer"}}), "abc");
}

TEST(OutputParser, PromptOpensThinking) {
  EXPECT_TRUE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
}
