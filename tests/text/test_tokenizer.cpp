#include <time.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "common.h"
#include "core/error.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

using namespace lily::text;
using namespace lily::text::testing;
using nlohmann::json;

namespace {

std::shared_ptr<const Tokenizer> qwen3() {
  static std::shared_ptr<const Tokenizer> t = Tokenizer::load(qwen3_dir());
  return t;
}

// The Qwen3 tokenizer.json with its Split regex replaced by the Qwen3.5 one from the expected data.
std::shared_ptr<const Tokenizer> qwen35_regex() {
  static std::shared_ptr<const Tokenizer> t = [] {
    json tok = load_json(qwen3_dir() / "tokenizer.json");
    json cases = load_json(data_dir() / "tokenizer_cases.json");
    for (auto& p : tok["pre_tokenizer"]["pretokenizers"])
      if (p["type"] == "Split") p["pattern"]["Regex"] = cases["qwen35_regex"];
    return Tokenizer::from_json(tok, load_json(qwen3_dir() / "tokenizer_config.json"), "qwen3.5-regex variant");
  }();
  return t;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (auto x : v) s += std::to_string(x) + ",";
  return s;
}

}  // namespace

TEST(Utf8, SanitizeAndPrefix) {
  EXPECT_TRUE(utf8_valid("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(utf8_valid("\xC3"));
  EXPECT_FALSE(utf8_valid("\xED\xA0\x80"));  // surrogate
  EXPECT_FALSE(utf8_valid("\xC0\xAF"));      // overlong
  EXPECT_EQ(utf8_sanitize("a\xF0\x9F\x98" "b"), "a\xEF\xBF\xBD" "b");  // one U+FFFD for a maximal subpart
  EXPECT_EQ(utf8_sanitize("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8_complete_prefix("ab\xFF"), 3u);
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");
}

TEST(Tokenizer, MatchesReferenceCorpus) {
  LILY_REQUIRE_QWEN3();
  json cases = load_json(data_dir() / "tokenizer_cases.json");
  ASSERT_GT(cases["cases"].size(), 50u);
  auto t = qwen3();
  for (auto& c : cases["cases"]) {
    std::string text = c["text"];
    auto ids = t->encode(text);
    EXPECT_EQ(show(ids), show(c["ids"].get<std::vector<int32_t>>())) << "text: " << json(text).dump();
    EXPECT_EQ(t->decode(ids), nfc(text)) << "text: " << json(text).dump();
  }
}

TEST(Tokenizer, MatchesReferenceCorpusQwen35Regex) {
  LILY_REQUIRE_QWEN3();
  json cases = load_json(data_dir() / "tokenizer_cases.json");
  auto t = qwen35_regex();
  int differ = 0;
  for (auto& c : cases["cases"]) {
    std::string text = c["text"];
    auto ids = t->encode(text);
    EXPECT_EQ(show(ids), show(c["ids_qwen35_regex"].get<std::vector<int32_t>>())) << "text: " << json(text).dump();
    differ += c["ids_qwen35_regex"] != c["ids"];
  }
  EXPECT_GT(differ, 0) << "the corpus should contain text where the two regexes split differently";
}

TEST(Tokenizer, SpecialTokenIds) {
  LILY_REQUIRE_QWEN3();
  auto t = qwen3();
  EXPECT_EQ(t->im_start_id(), 151644);
  EXPECT_EQ(t->im_end_id(), 151645);
  EXPECT_EQ(t->endoftext_id(), 151643);
  EXPECT_EQ(t->eos_id(), 151645);  // tokenizer_config eos_token is <|im_end|>
  EXPECT_EQ(t->token_id("<think>").value_or(-1), 151667);
  EXPECT_TRUE(t->is_special(151644));
  EXPECT_FALSE(t->is_special(151667));
  EXPECT_EQ(t->vocab_size(), 151669);
  EXPECT_EQ(t->decode({151644, 872}), "<|im_start|>user");
  EXPECT_EQ(t->decode({151644, 872}, true), "user");
  EXPECT_THROW(t->decode({151700}), lily::InputError);
  // With parse_special = false, special tokens in text are plain text.
  auto ids = t->encode("<|im_end|>", false);
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(t->decode(ids), "<|im_end|>");
}

TEST(Tokenizer, StreamDecoderNeverSplitsCharacters) {
  LILY_REQUIRE_QWEN3();
  auto t = qwen3();
  std::string text = "Emoji 😀👨‍👩‍👧 and 你好世界, e\xCC\x81, Привет! 🇫🇷";
  auto ids = t->encode(text);
  StreamDecoder sd(t);
  std::string acc;
  for (auto id : ids) {
    std::string piece = sd.push(id);
    EXPECT_TRUE(utf8_valid(piece)) << "piece after id " << id;
    acc += piece;
  }
  acc += sd.flush();
  EXPECT_EQ(acc, nfc(text));
  // A lone lead byte token is held, then replaced on flush.
  int32_t lead = -1;
  for (int32_t id = 0; id < 1000 && lead < 0; ++id)
    if (t->token_bytes(id) == "\xF0") lead = id;
  ASSERT_GE(lead, 0);
  EXPECT_EQ(sd.push(lead), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, FuzzRandomBytes) {
  LILY_REQUIRE_QWEN3();
  auto t = qwen3();
  std::mt19937 rng(1234);
  const char* pieces[] = {"a", " ", "\n", "é", "e\xCC\x81", "你", "😀", "<|im_end|>", "<think>", "1", "'s", "\t", "\xF0", "\xFF", "Z"};
  for (int iter = 0; iter < 400; ++iter) {
    std::string s;
    int len = int(rng() % 40);
    for (int k = 0; k < len; ++k) {
      if (rng() % 3 == 0) s += char(rng() % 256);
      else s += pieces[rng() % std::size(pieces)];
    }
    std::vector<int32_t> ids;
    ASSERT_NO_THROW(ids = t->encode(s));
    std::string back = t->decode(ids);
    EXPECT_EQ(back, nfc(utf8_sanitize(s)));
    if (utf8_valid(s)) {
      EXPECT_EQ(back, nfc(s));
    }
  }
}

TEST(Tokenizer, MalformedJsonNamesThePlace) {
  json good = {{"model",
                {{"type", "BPE"},
                 {"vocab", json::object()},
                 {"merges", json::array()}}}};
  auto msg = [](const json& j) {
    try {
      Tokenizer::from_json(j, nullptr, "t.json");
    } catch (const lily::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(json::array()).find("t.json"), std::string::npos);
  EXPECT_NE(msg(json::object()).find("model"), std::string::npos);
  EXPECT_NE(msg(good).find("byte 0x00"), std::string::npos);  // vocab lacks byte tokens
  if (!have_qwen3()) return;
  json tok = load_json(qwen3_dir() / "tokenizer.json");
  // Each edit is undone after its check so that the 11 MB document is parsed once.
  auto with = [&](json& slot, json bad, const std::string& where) {
    json saved = std::move(slot);
    slot = std::move(bad);
    EXPECT_NE(msg(tok).find(where), std::string::npos) << msg(tok);
    slot = std::move(saved);
  };
  with(tok["model"]["merges"][5], 17, "model.merges[5]");
  with(tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], "([a-", "pre_tokenizer.pretokenizers[0].pattern");
  with(tok["added_tokens"][2]["id"], "x", "added_tokens[2].id");
  with(tok["normalizer"]["type"], "Weird", "normalizer.type");
  with(tok["model"]["vocab"], json::array(), "model.vocab");
}

// Ids size the id tables: a huge one must be refused, not allocated.
TEST(Tokenizer, HugeIdsAreRefused) {
  auto dir = std::filesystem::temp_directory_path() / "lily_text_huge_id";
  std::filesystem::create_directories(dir);
  auto msg = [&](const std::string& doc) {
    std::ofstream(dir / "tokenizer.json") << doc;
    try {
      Tokenizer::load(dir);
    } catch (const lily::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string e = msg(R"({"model": {"type": "BPE", "vocab": {"a": 0, "big": 2147483647}, "merges": []}})");
  EXPECT_TRUE(contains(e, (dir / "tokenizer.json").string())) << e;
  EXPECT_TRUE(contains(e, "\"big\"")) << e;
  EXPECT_TRUE(contains(e, "2147483647")) << e;
  e = msg(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
              "added_tokens": [{"id": 2147483647, "content": "<huge>", "special": true}]})");
  EXPECT_TRUE(contains(e, "added_tokens[0].id")) << e;
  EXPECT_TRUE(contains(e, "\"<huge>\"")) << e;
  EXPECT_TRUE(contains(e, "2147483647")) << e;
  // Under the absolute bound but far beyond the number of tokens.
  e = msg(R"({"model": {"type": "BPE", "vocab": {"a": 0, "sparse": 9000000}, "merges": []}})");
  EXPECT_TRUE(contains(e, "\"sparse\" has id 9000000, but there are only 2 tokens")) << e;
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, StringFormMerges) {
  LILY_REQUIRE_QWEN3();
  // Merges in the "a b" string form give the same tokenizer as the array form.
  json tok = load_json(qwen3_dir() / "tokenizer.json");
  for (auto& m : tok["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  auto t2 = Tokenizer::from_json(tok, nullptr, "string-merges");
  json cases = load_json(data_dir() / "tokenizer_cases.json");
  for (auto& c : cases["cases"]) EXPECT_EQ(show(t2->encode(c["text"].get<std::string>())), show(c["ids"].get<std::vector<int32_t>>()));
}

TEST(Tokenizer, AddedTokenFlags) {
  LILY_REQUIRE_QWEN3();
  json tok = load_json(qwen3_dir() / "tokenizer.json");
  tok["added_tokens"].push_back({{"id", 151669}, {"content", "[LS]"}, {"single_word", false}, {"lstrip", true},
                                 {"rstrip", false}, {"normalized", false}, {"special", true}});
  tok["added_tokens"].push_back({{"id", 151670}, {"content", "[RS]"}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", true}, {"normalized", false}, {"special", true}});
  tok["added_tokens"].push_back({{"id", 151671}, {"content", "word"}, {"single_word", true}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", true}, {"special", false}});
  auto t = Tokenizer::from_json(tok, nullptr, "flags");
  auto base = qwen3();
  auto ids = t->encode("a  [LS]b");  // lstrip eats the spaces before
  EXPECT_EQ(show(ids), show({base->encode("a")[0], 151669, base->encode("b")[0]}));
  ids = t->encode("a[RS]  b");  // rstrip eats the spaces after
  EXPECT_EQ(show(ids), show({base->encode("a")[0], 151670, base->encode("b")[0]}));
  ids = t->encode("a word here");
  EXPECT_NE(std::find(ids.begin(), ids.end(), 151671), ids.end());
  ids = t->encode("swordfish");  // single_word: not inside another word
  EXPECT_EQ(std::find(ids.begin(), ids.end(), 151671), ids.end());
}

TEST(Tokenizer, Throughput) {
  LILY_REQUIRE_QWEN3();
  auto t = qwen3();
  std::string para =
      "The engine reads the model's tokenizer and chat template, then turns each message into token ids. "
      "Performance matters: a long document of several megabytes should be tokenized in well under a second, "
      "so the byte-pair merges are cached per pre-token and the regex runs with the PCRE2 JIT.\n";
  std::string text;
  std::mt19937 rng(7);
  while (text.size() < (4u << 20)) {
    text += para;
    text += "Item " + std::to_string(rng() % 100000) + " costs $" + std::to_string(rng() % 1000) + ".\n";
  }
  t->encode(text.substr(0, 1 << 20));  // warm the cache
  // CPU time of this thread: the rate of one core, whatever else the machine is running.
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  double t0 = cpu_now();
  auto ids = t->encode(text);
  double s = cpu_now() - t0;
  double mbps = double(text.size()) / s / 1e6;
  RecordProperty("tokenize_MBps", std::to_string(mbps));
  // Worst case for the pre-token cache: 2 MB of distinct-looking words (random vocabulary entries made
  // of letters), cache cleared by using a fresh tokenizer.
  {
    std::vector<std::string> words;
    for (int32_t id = 0; id < 150000; ++id) {
      const std::string& w = t->token_bytes(id);
      if (w.size() > 2 && w[0] == ' ' && std::all_of(w.begin() + 1, w.end(), [](char ch) { return std::isalpha(uint8_t(ch)); }))
        words.push_back(w);
    }
    std::string wild;
    while (wild.size() < (2u << 20)) {
      wild += words[rng() % words.size()];
      if (rng() % 12 == 0) wild += rng() % 2 ? ".\n" : ",";
    }
    auto fresh = Tokenizer::load(qwen3_dir());
    double c0 = cpu_now();
    auto wids = fresh->encode(wild);
    double cs = cpu_now() - c0;
    std::printf("tokenizer, cold cache: %.1f MB of random vocabulary words in %.3f s of CPU = %.1f MB/s (%zu tokens)\n",
                wild.size() / 1e6, cs, double(wild.size()) / cs / 1e6, wids.size());
    EXPECT_EQ(fresh->decode(wids), wild);
  }
  std::printf("tokenizer: %.1f MB of English in %.3f s of CPU = %.1f MB/s on one core (%zu tokens)\n", text.size() / 1e6, s, mbps, ids.size());
  EXPECT_EQ(t->decode(ids), text);
#if defined(NDEBUG) && !defined(LILY_SANITIZED)
  EXPECT_GT(mbps, 5.0);
#endif
}
