// Generated text -> the streaming output parser (reasoning, Qwen3 JSON and Qwen3.5 XML tool calls,
// arguments coerced by a tool schema), fed whole, byte by byte and in chunks the input chooses: any
// chunking must give the same content, reasoning and tool calls. Also parse_tool_call and
// coerce_to_schema on the raw text.
#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "text/output_parser.h"

namespace {
using ojson = nlohmann::ordered_json;

const ojson& tools() {
  // The tools of tests/data/text/output_corpus.json (the seeds' tool calls use them).
  static const ojson t = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object",
     "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "detailed": {"type": "boolean"},
                    "unit": {"type": ["string", "null"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
     "query": {"type": "string"}, "filters": {"type": "object", "properties": {"site": {"type": "string"}, "max": {"type": "integer"}}},
     "tags": {"type": "array", "items": {"type": "string"}}, "safe": {"type": "boolean"}, "score": {"type": "number"}}}}}])");
  return t;
}

lily::text::ParsedDelta run(const lily::text::OutputParserOptions& o, std::string_view text, const uint8_t* cuts, size_t ncuts) {
  lily::text::OutputParser p(o);
  lily::text::ParsedDelta all;
  size_t pos = 0;
  for (size_t i = 0; i < ncuts && pos < text.size(); ++i) {
    const size_t n = std::min<size_t>(text.size() - pos, cuts[i] % 8);
    all.append(p.feed(text.substr(pos, n)));
    pos += n;
  }
  all.append(p.feed(text.substr(pos)));
  all.append(p.finish());
  return all;
}

bool same(const lily::text::ParsedDelta& a, const lily::text::ParsedDelta& b) {
  if (a.content != b.content || a.reasoning != b.reasoning || a.tool_calls.size() != b.tool_calls.size()) return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].arguments != b.tool_calls[i].arguments) return false;
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // First byte: options; then up to 32 chunk lengths (mod 8) after a 0xff marker, if any; the rest is text.
  const uint8_t flags = data[0];
  std::string_view rest = lily::fuzz::as_text(data + 1, size - 1);
  const uint8_t* cuts = nullptr;
  size_t ncuts = 0;
  if (!rest.empty() && uint8_t(rest[0]) == 0xff) {
    ncuts = std::min<size_t>(32, rest.size() - 1);
    cuts = reinterpret_cast<const uint8_t*>(rest.data() + 1);
    rest.remove_prefix(1 + ncuts);
  }
  lily::text::OutputParserOptions o;
  o.parse_reasoning = flags & 1;
  o.start_in_reasoning = flags & 2;
  o.parse_tool_calls = flags & 4;
  if (flags & 8) o.tools = tools();
  try {
    const auto whole = run(o, rest, nullptr, 0);
    static const uint8_t ones[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    LILY_FUZZ_REQUIRE(same(whole, run(o, rest, ones, 32)));
    if (ncuts) LILY_FUZZ_REQUIRE(same(whole, run(o, rest, cuts, ncuts)));
    (void)lily::text::parse_tool_call(rest, o.tools);
    auto v = ojson::parse(rest.begin(), rest.end(), nullptr, false);
    if (!v.is_discarded())
      for (const char* type : {"string", "integer", "number", "boolean", "object", "array", "null"})
        (void)lily::text::coerce_to_schema(v, ojson{{"type", type}});
  } catch (const lily::InputError&) {
  }
  return 0;
}
