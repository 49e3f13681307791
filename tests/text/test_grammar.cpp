// Grammars over bytes, JSON Schema compilation, and token masks (the trie walk against a per-token
// reference), on awkward cases: escapes, UTF-8 split across tokens, exponents, tokens spanning symbols.
#include <ctime>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "common.h"
#include "core/error.h"
#include "text/grammar_automaton.h"
#include "text/json_grammar.h"
#include "text/output_grammar.h"
#include "text/output_parser.h"
#include "text/token_grammar.h"
#include "text/tokenizer.h"

namespace lily::text {
namespace {

using ojson = nlohmann::ordered_json;

bool matches(const Grammar& g, std::string_view s) {
  ByteAutomaton a(g);
  auto st = a.walk(a.start(), s);
  return st != ByteAutomaton::kDead && a.accepting(st);
}

bool prefix_ok(const Grammar& g, std::string_view s) {
  ByteAutomaton a(g);
  return a.walk(a.start(), s) != ByteAutomaton::kDead;
}

Grammar schema(const char* s) { return json_schema_grammar(ojson::parse(s), "schema"); }

TEST(Grammar, LiteralsAlternativesAndDistance) {
  Grammar g;
  auto r = g.rule("root", {g.lit("ab"), g.lit("abcd")});
  g.set_root(r);
  ByteAutomaton a(g);
  EXPECT_EQ(a.distance(a.start()), 2);
  EXPECT_EQ(a.next_byte(a.start()), 'a');
  auto s = a.walk(a.start(), "ab");
  ASSERT_NE(s, ByteAutomaton::kDead);
  EXPECT_TRUE(a.accepting(s));
  EXPECT_EQ(a.next_byte(s), -1);
  EXPECT_TRUE(a.can_continue(s));
  EXPECT_EQ(a.walk(a.start(), "ax"), ByteAutomaton::kDead);
  auto e = a.walk(a.start(), "abcd");
  EXPECT_TRUE(a.accepting(e));
  EXPECT_FALSE(a.can_continue(e));
}

TEST(Grammar, LeftRecursionAndEndlessRulesAreRefused) {
  Grammar g;
  auto r = g.rule("list");
  g.alt(r, cat({{Grammar::ref(r)}, g.lit("x")}));
  g.alt(r, g.lit("x"));
  g.set_root(r);
  EXPECT_THROW(ByteAutomaton{g}, InternalError);
  Grammar h;
  auto e = h.rule("endless");
  h.alt(e, cat({h.lit("x"), {Grammar::ref(e)}}));
  h.set_root(e);
  EXPECT_THROW(ByteAutomaton{h}, InternalError);
}

TEST(Grammar, TextUntilStopsAtTheFirstOccurrence) {
  Grammar g;
  auto r = text_until(g, "t", "</think>", ByteSet::range(0, 255));
  g.set_root(r);
  EXPECT_TRUE(matches(g, "</think>"));
  EXPECT_TRUE(matches(g, "a < b </thin </think>"));
  EXPECT_TRUE(matches(g, "<</</think>"));
  EXPECT_FALSE(matches(g, "a</think>b"));
  EXPECT_FALSE(matches(g, "no end"));
}

TEST(Grammar, TextUntilKeepsOutForbiddenStrings) {
  Grammar g;
  auto r = text_until(g, "t", "</think>", ByteSet::range(0, 255), {"<tool_call>", "abab"});
  g.set_root(r);
  EXPECT_TRUE(matches(g, "</think>"));
  EXPECT_TRUE(matches(g, "a <tool_cal> <tool</think>"));
  EXPECT_TRUE(matches(g, "aba bab <</think>"));
  EXPECT_FALSE(matches(g, "<tool_call></think>"));
  EXPECT_FALSE(matches(g, "x <</tool_call><tool_call> y</think>"));
  EXPECT_FALSE(matches(g, "ababab</think>"));  // overlapping: "abab" at 0 and 2
  EXPECT_FALSE(matches(g, "aabab</think>"));
  EXPECT_FALSE(matches(g, "a</think>b"));
  // Against a brute-force reading over every string of the alphabet up to 7 bytes before the stop.
  Grammar h;
  auto q = text_until(h, "q", "aab", ByteSet::range('a', 'c'), {"ba", "cc"});
  h.set_root(q);
  std::vector<std::string> all = {""};
  for (size_t n = 0, lo = 0; n < 7; ++n) {
    const size_t hi = all.size();
    for (size_t i = lo; i < hi; ++i)
      for (char c : {'a', 'b', 'c'}) all.push_back(all[i] + c);
    lo = hi;
  }
  ByteAutomaton a(h);
  for (const std::string& x : all) {
    const std::string t = x + "aab";
    const bool want = t.find("aab") == x.size() && t.find("ba") == std::string::npos && t.find("cc") == std::string::npos;
    const auto st = a.walk(a.start(), t);
    EXPECT_EQ(st != ByteAutomaton::kDead && a.accepting(st), want) << t;
  }
}

TEST(JsonGrammar, Strings) {
  auto g = schema(R"({"type": "string"})");
  EXPECT_TRUE(matches(g, R"("")"));
  EXPECT_TRUE(matches(g, R"("a\"b\\c\/\b\f\n\r\t")"));
  EXPECT_TRUE(matches(g, R"("\u00e9\u20AC")"));
  EXPECT_TRUE(matches(g, "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\""));  // é € 😀 as UTF-8
  EXPECT_FALSE(matches(g, R"("\ud83d\ude00")"));      // surrogate escapes are not produced
  EXPECT_FALSE(matches(g, R"("\x")"));
  EXPECT_FALSE(matches(g, R"("\u12")"));
  EXPECT_FALSE(matches(g, "\"a\nb\""));               // control characters must be escaped
  EXPECT_FALSE(matches(g, "\"\xC0\x80\""));           // overlong
  EXPECT_FALSE(matches(g, "\"\xED\xA0\x80\""));       // UTF-8 surrogate
  EXPECT_FALSE(matches(g, "\"\x80\""));               // lone continuation byte
  EXPECT_TRUE(prefix_ok(g, "\"\xE2\x82"));            // a character split across tokens
  auto b = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(matches(b, R"("a")"));
  EXPECT_TRUE(matches(b, R"("ab")"));
  EXPECT_TRUE(matches(b, "\"\xC3\xA9\\n\xF0\x9F\x98\x80\""));  // three characters, eight bytes
  EXPECT_FALSE(matches(b, R"("abcd")"));
}

TEST(JsonGrammar, Numbers) {
  auto n = schema(R"({"type": "number"})");
  for (const char* ok : {"0", "-0", "12", "-0.5", "1e5", "1E+5", "2.5e-10", "123456789.25"}) EXPECT_TRUE(matches(n, ok)) << ok;
  for (const char* no : {"01", "1.", ".5", "+1", "1e", "--1", "1.5e+", "0x10", "1e123"}) EXPECT_FALSE(matches(n, no)) << no;
  auto i = schema(R"({"type": "integer"})");
  EXPECT_TRUE(matches(i, "-42"));
  EXPECT_FALSE(matches(i, "1.0"));
  EXPECT_FALSE(matches(i, "1e3"));
  EXPECT_FALSE(matches(i, "12345678901234567"));  // 17 digits
}

TEST(JsonGrammar, ObjectsRequiredOptionalAndOrder) {
  auto g = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"},
                      "c": {"type": "null"}}, "required": ["b"]})");
  EXPECT_TRUE(matches(g, R"({"b":true})"));
  EXPECT_TRUE(matches(g, R"({"a": 1, "b": false, "c": null})"));
  EXPECT_TRUE(matches(g, "{\n  \"a\": 1,\n  \"b\": true\n}"));
  EXPECT_TRUE(matches(g, R"({"b":true,"c":null})"));
  EXPECT_FALSE(matches(g, R"({})"));                   // b is required
  EXPECT_FALSE(matches(g, R"({"b":true,"a":1})"));     // declared order
  EXPECT_FALSE(matches(g, R"({"b":true,"d":1})"));     // no extra keys by default
  EXPECT_FALSE(matches(g, R"({"b":true,})"));
  EXPECT_FALSE(matches(g, R"({,"b":true})"));
  EXPECT_FALSE(matches(g, " {\"b\":true}"));          // no whitespace around the document
}

TEST(JsonGrammar, AdditionalProperties) {
  auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(matches(g, R"({"name":"x","n":1,"na":2,"names":3,"":4})"));
  EXPECT_TRUE(matches(g, R"({"x":1})"));
  EXPECT_FALSE(matches(g, R"({"name":"x","name":1})"));  // an extra key never repeats a declared one
  EXPECT_FALSE(matches(g, R"({"x":"s"})"));
  auto any = schema(R"({"type": "object", "additionalProperties": true})");
  EXPECT_FALSE(matches(any, R"({"k":[1,{"z":null}],"\u00e9":"v"})"));  // extra keys carry no escapes
  EXPECT_TRUE(matches(any, "{\"k\":[1,{\"z\":null}],\"\xC3\xA9\":\"v\"}"));
}

TEST(JsonGrammar, ArraysEnumsConstAnyOfRefs) {
  auto a = schema(R"({"type": "array", "items": {"enum": ["x", 2, null, {"k": [true]}]}, "minItems": 1, "maxItems": 3})");
  EXPECT_FALSE(matches(a, "[]"));
  EXPECT_TRUE(matches(a, R"(["x"])"));
  EXPECT_TRUE(matches(a, R"([2, null, {"k":[true]}])"));
  EXPECT_FALSE(matches(a, R"(["x","x","x","x"])"));
  EXPECT_FALSE(matches(a, R"(["y"])"));
  auto t = schema(R"({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})");
  EXPECT_TRUE(matches(t, R"([1, "a"])"));
  EXPECT_TRUE(matches(t, R"([1])"));
  EXPECT_FALSE(matches(t, R"([1, "a", 2])"));
  auto u = schema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}], "nullable": false})");
  EXPECT_TRUE(matches(u, "7"));
  EXPECT_TRUE(matches(u, R"("a")"));
  EXPECT_FALSE(matches(u, R"("ab")"));
  auto c = schema(R"({"const": "on"})");
  EXPECT_TRUE(matches(c, R"("on")"));
  EXPECT_FALSE(matches(c, R"("off")"));
  auto r = schema(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
                      "$ref": "#/$defs/node"})");
  EXPECT_TRUE(matches(r, R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"));
  EXPECT_FALSE(matches(r, R"({"v":1,"kids":[{"kids":[]}]})"));
  auto all = schema(R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]})");
  EXPECT_TRUE(matches(all, R"({"a":1,"b":2})"));
  EXPECT_FALSE(matches(all, R"({"a":1})"));
}

TEST(JsonGrammar, JsonObjectModeAcceptsAnyObject) {
  auto g = json_object_grammar();
  EXPECT_TRUE(matches(g, R"({})"));
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5e3, "x\n", {"b": {}}], "c": [], "d": [[[]]]})"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, R"({"a" 1})"));
}

TEST(JsonGrammar, MalformedSchemasNameTheLocation) {
  auto err = [](const char* s) {
    try {
      schema(s);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err(R"({"type": "strin"})").find("schema/type"), std::string::npos);
  EXPECT_NE(err(R"({"properties": {"a": {"type": 3}}})").find("schema/properties/a/type"), std::string::npos);
  EXPECT_NE(err(R"({"enum": []})").find("schema/enum"), std::string::npos);
  EXPECT_NE(err(R"({"$ref": "#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(err(R"({"type": "array", "minItems": 3, "maxItems": 1})").find("maxItems"), std::string::npos);
  EXPECT_NE(err(R"({"type": "array", "items": false, "minItems": 1})").find("minItems"), std::string::npos);
  EXPECT_NE(err("false").find("matches nothing"), std::string::npos);
}

// Schemas a client may send that name no finite document, contain themselves, or blow up: each is an
// InputError naming the schema, in bounded time (no InternalError, no endless recursion).
TEST(JsonGrammar, HostileSchemasAreInputErrors) {
  std::string chain = R"({"$defs": {"d0": {"type": "integer"})";
  for (int k = 1; k <= 40; ++k)
    chain += fmt::format(R"(, "d{0}": {{"type": "object", "properties": {{"a": {{"allOf": [{{"$ref": "#/$defs/d{1}"}}]}},
                         "b": {{"allOf": [{{"$ref": "#/$defs/d{1}"}}]}}}}}})", k, k - 1);
  chain += R"(}, "$ref": "#/$defs/d40"})";
  // Many properties through allOf (each optional one deepens the automaton's expansion), and long
  // property names beside additionalProperties (a trie of the names, one rule per byte).
  ojson wide = {{"allOf", ojson::array()}}, long_names = {{"additionalProperties", true}, {"properties", ojson::object()}};
  for (int part = 0; part < 2; ++part) {
    ojson props = ojson::object();
    for (int i = 0; i < 3000; ++i) props[fmt::format("p{}_{}", part, i)] = ojson::object();
    wide["allOf"].push_back({{"properties", props}});
  }
  for (int i = 0; i < 4000; ++i) long_names["properties"][fmt::format("{}{}", i, std::string(200, 'x'))] = ojson::object();
  const std::vector<std::pair<std::string, const char*>> cases = {
      {R"({"$ref": "#"})", "no finite"},
      {R"({"allOf": [{"$ref": 5}]})", "must be a string"},
      {R"({"$defs": {"n": 5}, "allOf": [{"$ref": "#/$defs/n"}]})", "not a schema"},
      {R"({"$defs": {"n": false}, "$ref": "#/$defs/n", "type": "string"})", "matches nothing"},
      {R"({"allOf": [{"$ref": "#"}]})", "nests deeper"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]})", "no finite"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})", "no finite"},
      {R"({"type": "array", "minItems": 4096, "items": {"type": "array", "minItems": 4096, "items": {"type": "string", "minLength": 4096}}})",
       "no finite"},
      {chain, "grammar rules"},
      {wide.dump(), "more than 4096 properties"},
      {long_names.dump(), "grammar rules"},
  };
  for (auto& [s, want] : cases) {
    // CPU seconds of this process, not wall time: a loaded machine stretches the latter (a 1.1 s case took
    // 7 s of wall time at load 11 on 2 cores).
#ifdef LILY_SANITIZED
    constexpr double kBound = 40.0;  // ASan + UBSan run these 3-8x slower
#else
    constexpr double kBound = 5.0;
#endif
    const std::clock_t t0 = std::clock();
    try {
      schema(s.c_str());
      ADD_FAILURE() << "accepted: " << s.substr(0, 120);
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("schema", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_LT(double(std::clock() - t0) / CLOCKS_PER_SEC, kBound) << s.substr(0, 120);
  }
  // The same in a tool's parameters.
  ToolCallGrammarOptions o;
  o.tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}])");
  EXPECT_THROW(tool_call_grammar(o), InputError);
}

// Shortest lengths against a plain fixpoint over random grammars (rules referring forwards, backwards,
// to themselves, and rules with no finite text).
TEST(Grammar, MinLengthsMatchFixpoint) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Grammar g;
    const int n = 1 + int(rng() % 30);
    for (int r = 0; r < n; ++r) g.rule(fmt::format("r{}", r));
    for (int r = 0; r < n; ++r)
      for (int a = int(rng() % 3); a >= 0; --a) {
        Grammar::Seq seq;
        for (int k = int(rng() % 4); k > 0; --k)
          seq.push_back(rng() % 2 ? g.lit("x")[0] : Grammar::ref(Grammar::RuleId(rng() % uint32_t(n))));
        g.alt(Grammar::RuleId(r), seq);
      }
    const int32_t inf = INT32_MAX / 4;
    std::vector<int64_t> ref(size_t(n), inf);
    for (bool changed = true; changed;) {
      changed = false;
      for (int r = 0; r < n; ++r)
        for (auto& a : g.alts(Grammar::RuleId(r))) {
          int64_t len = 0;
          for (auto& s : a) len += s.kind == Grammar::Symbol::Bytes ? 1 : ref[s.index];
          if (len < ref[size_t(r)]) ref[size_t(r)] = std::min<int64_t>(len, inf), changed = true;
        }
    }
    auto got = g.min_lengths();
    for (int r = 0; r < n; ++r) EXPECT_EQ(got[size_t(r)], ref[size_t(r)]) << "trial " << trial << " rule " << r << "\n" << g.to_string();
  }
}

TEST(OutputGrammar, ToolCallsAfterReasoning) {
  ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "noop"}}])");
  ToolCallGrammarOptions o;
  o.tools = tools;
  o.reasoning = ReasoningMode::Optional;
  auto g = tool_call_grammar(o);
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
  EXPECT_TRUE(matches(g, call));
  EXPECT_TRUE(matches(g, "<think>\nhmm <tool_call inside\n</think>\n\n" + call));
  // A <tool_call> inside the block would start a call for the output parser: the grammar keeps it out.
  EXPECT_FALSE(matches(g, "<think>\nhmm <tool_call> inside\n</think>\n\n" + call));
  EXPECT_FALSE(matches(g, "<think>\n" + call + "\n</think>\n\n" + call));
  EXPECT_TRUE(matches(g, "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(g, call + "\n" + call));  // one call unless max_calls says more
  EXPECT_FALSE(matches(g, "Sure! " + call));
  o.max_calls = 2;
  o.only = "get_weather";
  auto two = tool_call_grammar(o);
  EXPECT_TRUE(matches(two, call + "\n" + call));
  EXPECT_FALSE(matches(two, "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));
  o.only = "missing";
  EXPECT_THROW(tool_call_grammar(o), InputError);

  o = {};
  o.tools = tools;
  o.syntax = ToolCallSyntax::Xml;
  o.reasoning = ReasoningMode::Open;
  auto x = tool_call_grammar(o);
  const std::string xcall = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(matches(x, "thinking\n</think>\n\n" + xcall));
  EXPECT_FALSE(matches(x, xcall));  // the prompt opened <think>: it must be closed first
  // What the grammar lets through, the output parser reads back as the same call.
  OutputParserOptions po;
  po.tools = tools;
  OutputParser p(po);
  auto d = p.feed(xcall);
  d.append(p.finish());
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, ojson::parse(R"({"city": "New\nYork", "days": 3})"));
}

// ---- token masks ----

// The token bound by definition: the shortest completion spelled byte by byte (each time the lowest
// byte that takes the automaton one byte closer to accepting), then the fewest tokens that spell it.
int32_t reference_bound(ByteAutomaton& a, const std::set<std::string>& tokens, ByteAutomaton::State s) {
  std::string w;
  while (!a.accepting(s)) {
    int next = -1;
    for (int b = 0; b < 256 && next < 0; ++b) {
      auto t = a.step(s, uint8_t(b));
      if (t != ByteAutomaton::kDead && a.distance(t) == a.distance(s) - 1) next = b;
    }
    if (next < 0) return TokenGrammar::kUnreachable;
    w.push_back(char(next));
    s = a.step(s, uint8_t(next));
  }
  std::vector<int32_t> u(w.size() + 1, TokenGrammar::kUnreachable);
  u[w.size()] = 0;
  for (size_t i = w.size(); i-- > 0;)
    for (size_t j = i + 1; j <= w.size(); ++j)
      if (u[j] < TokenGrammar::kUnreachable && tokens.count(w.substr(i, j - i))) u[i] = std::min(u[i], 1 + u[j]);
  return u[0];
}

// The mask by definition: each token's bytes walked through the automaton from the state's text.
std::vector<uint64_t> reference_mask(const Grammar& g, const TokenVocabulary& v, const std::string& text,
                                     const std::vector<int32_t>& end_ids, int64_t budget) {
  ByteAutomaton a(g);
  auto s = a.walk(a.start(), text);
  std::vector<uint64_t> m((size_t(v.size()) + 63) / 64, 0);
  std::set<std::string> tokens;
  if (budget >= 0)
    for (int32_t id = 0; id < v.size(); ++id)
      if (!v.bytes(id).empty()) tokens.insert(v.bytes(id));
  std::map<ByteAutomaton::State, int32_t> bounds;
  auto bound = [&](ByteAutomaton::State q) {
    auto it = bounds.find(q);
    if (it == bounds.end()) it = bounds.emplace(q, reference_bound(a, tokens, q)).first;
    return it->second;
  };
  const bool limit = budget >= 0 && bound(s) <= budget;
  for (int32_t id = 0; id < v.size(); ++id) {
    bool ok;
    if (std::find(end_ids.begin(), end_ids.end(), id) != end_ids.end()) {
      ok = a.accepting(s);
    } else if (v.bytes(id).empty()) {
      ok = false;
    } else {
      auto t = a.walk(s, v.bytes(id));
      ok = t != ByteAutomaton::kDead && (!limit || bound(t) <= budget - 1);
    }
    if (ok) m[size_t(id) >> 6] |= uint64_t(1) << (id & 63);
  }
  return m;
}

std::vector<int32_t> ids_of(const std::vector<uint64_t>& m) {
  std::vector<int32_t> out;
  for (size_t w = 0; w < m.size(); ++w)
    for (int b = 0; b < 64; ++b)
      if (m[w] >> b & 1) out.push_back(int32_t(w * 64 + size_t(b)));
  return out;
}

// Random walks: at every step the trie mask equals the reference, then a random allowed token is taken.
void check_walks(const Grammar& g, std::shared_ptr<const TokenVocabulary> v, int walks, int steps, int64_t budget,
                 uint64_t seed, bool reference = true, int32_t end_id = -1) {
  const std::vector<int32_t> end_ids = {end_id >= 0 ? end_id : v->size() - 1};
  TokenGrammar tg(g, v, end_ids);
  std::mt19937_64 rng(seed);
  for (int w = 0; w < walks; ++w) {
    auto s = tg.start();
    std::string text;
    bool ended = false;
    for (int i = 0; i < steps && !ended; ++i) {
      const int64_t left = budget < 0 ? -1 : budget - i;
      auto m = tg.mask(s, left);
      if (reference) {
        auto ref = reference_mask(g, *v, text, end_ids, left);
        ASSERT_EQ(ids_of(m->bits), ids_of(ref)) << "walk " << w << " step " << i << " after " << text;
      }
      auto ids = ids_of(m->bits);
      ASSERT_FALSE(ids.empty()) << "nothing allowed after " << text;
      int32_t t = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
      if (t == end_ids[0]) {
        ended = true;
        break;
      }
      s = tg.advance(s, t);
      ASSERT_NE(s, TokenGrammar::kDead);
      text += v->bytes(t);
      if (budget >= 0) {
        ASSERT_LE(tg.token_distance(s), budget - i - 1) << text;
      }
    }
    if (budget >= 0 && budget <= steps) {
      EXPECT_TRUE(ended || tg.accepting(s)) << "incomplete within the budget: " << text;
    }
  }
}

// A small vocabulary with every single byte plus tokens that span symbols and split characters.
std::shared_ptr<const TokenVocabulary> awkward_vocab() {
  std::vector<std::string> b;
  for (int c = 0; c < 256; ++c) b.push_back(std::string(1, char(c)));
  for (const char* t : {"{\"", "\":", "\": ", "\"}", "\",\"", "\\\"", "\\u00", "e9", "\\n", "\xC3", "\xA9\"", "\xE2\x82",
                        "\xAC", "\xF0\x9F\x98\x80", "1e", "e+", "-0.", "12", "true", "null}", "]}", "[{", "}]", ", ",
                        "\n  ", "name", "\"name\"", "abc", "\xC3\xA9", "\"name\": \"", "}\n", "<think>", "</think>",
                        "<tool_call>", "</tool_call>", "\n</"})
    b.push_back(t);
  b.push_back("{\"");  // a duplicate of an earlier token's bytes
  b.push_back("");     // a special token (never allowed)
  b.push_back("");     // the end id
  return std::make_shared<TokenVocabulary>(std::move(b));
}

TEST(TokenGrammar, MaskEqualsReferenceOnAwkwardTokens) {
  auto v = awkward_vocab();
  auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
      "n": {"type": "number"}, "tags": {"type": "array", "items": {"enum": ["a", "é"]}, "maxItems": 2},
      "ok": {"type": "boolean"}}, "required": ["name", "n"]})");
  check_walks(g, v, 30, 40, -1, 1);
  check_walks(json_object_grammar(), v, 20, 30, -1, 2);
}

TEST(TokenGrammar, BudgetAlwaysFinishesTheDocument) {
  auto v = awkward_vocab();
  auto g = schema(R"({"type": "object", "properties": {"s": {"type": "string"}, "a": {"type": "array",
      "items": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}, "required": ["s", "a"]})");
  for (int64_t budget : {16, 24, 40}) check_walks(g, v, 25, int(budget), budget, uint64_t(budget));
  check_walks(json_object_grammar(), v, 25, 20, 20, 9);
  // The tightest budget: the token bound of the start, below its 15 bytes since tokens span symbols.
  TokenGrammar probe(g, v, {v->size() - 1});
  const int32_t need = probe.token_distance(probe.start());
  EXPECT_EQ(ByteAutomaton(g).distance(0), 15);  // {"s":"","a":[]}
  EXPECT_LT(need, 15);
  check_walks(g, v, 25, need, need, 7);
}

TEST(TokenGrammar, EndIdOnlyWhereTheDocumentIsComplete) {
  auto v = awkward_vocab();
  const int32_t end = v->size() - 1;
  TokenGrammar tg(schema(R"({"type": "integer"})"), v, {end});
  auto s = tg.start();
  auto bit = [](const TokenMask& m, int32_t id) { return bool(m.bits[size_t(id) >> 6] >> (id & 63) & 1); };
  EXPECT_FALSE(bit(*tg.mask(s), end));
  s = tg.advance(s, int32_t('1'));
  EXPECT_TRUE(bit(*tg.mask(s), end));
  EXPECT_EQ(ids_of(tg.mask(s, 0)->bits), std::vector<int32_t>{end});  // no token left: only the end
  EXPECT_TRUE(bit(*tg.mask(s, 1), int32_t('2')));                     // one left: a digit still finishes
  EXPECT_GT(tg.mask(s)->text_tokens, 0);  // more digits may follow
  TokenGrammar obj(json_object_grammar(), v, {end});
  auto o = obj.advance_bytes(obj.start(), "{}");
  EXPECT_TRUE(obj.mask(o)->end_allowed);
  EXPECT_EQ(obj.mask(o)->text_tokens, 0);  // complete: only the end id
  EXPECT_EQ(ids_of(obj.mask(o)->bits), std::vector<int32_t>{end});
}

TEST(TokenGrammar, RealQwen3VocabularyMatchesReference) {
  LILY_REQUIRE_QWEN3();
  auto tok = Tokenizer::load(testing::qwen3_dir());
  auto v = TokenVocabulary::from_tokenizer(*tok, tok->vocab_size());
  EXPECT_TRUE(v->bytes(tok->im_end_id()).empty());            // special: never text
  EXPECT_EQ(v->bytes(*tok->token_id("<tool_call>")), "<tool_call>");  // not special: its text
  auto g = schema(R"({"type": "object", "properties": {"title": {"type": "string"}, "year": {"type": "integer"},
      "genres": {"type": "array", "items": {"enum": ["drama", "comédie"]}}}, "required": ["title", "year"]})");
  check_walks(g, v, 2, 12, -1, 3, true, tok->im_end_id());
  check_walks(g, v, 8, 40, 40, 4, false, tok->im_end_id());
  ToolCallGrammarOptions o;
  o.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer"}}, "required": ["city", "days"],
      "additionalProperties": false}}}])");
  o.reasoning = ReasoningMode::Optional;
  // The shortest call is 83 bytes but far fewer tokens: a budget of exactly that many finishes it.
  auto tg = tool_call_grammar(o);
  TokenGrammar probe(tg, v, {tok->im_end_id()});
  const int32_t need = probe.token_distance(probe.start());
  EXPECT_EQ(ByteAutomaton(tg).distance(0), 83);
  EXPECT_LE(need, 24);
  std::cout << "forced tool call: " << need << " tokens (83 bytes)\n";
  check_walks(tg, v, 8, need, need, 5, false, tok->im_end_id());
  check_walks(tg, v, 4, 96, 96, 6, false, tok->im_end_id());
}

}  // namespace
}  // namespace lily::text
