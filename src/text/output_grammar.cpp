#include "text/output_grammar.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "text/json_grammar.h"
#include "text/output_parser.h"

namespace lily::text {

using json = nlohmann::ordered_json;
using Seq = Grammar::Seq;
using RuleId = Grammar::RuleId;

ReasoningMode reasoning_mode(const std::string& prompt, bool thinking) {
  if (prompt_opens_thinking(prompt)) return ReasoningMode::Open;
  size_t turn = prompt.rfind("<|im_start|>assistant");
  if (turn != std::string::npos && prompt.find("</think>", turn) != std::string::npos) return ReasoningMode::None;
  return thinking ? ReasoningMode::Optional : ReasoningMode::None;
}

namespace {

// The reasoning block (per `mode`) followed by `body`, as the root rule.
void set_root_after_reasoning(Grammar& g, ReasoningMode mode, RuleId body) {
  RuleId root = g.rule("root");
  ByteSet any = ByteSet::range(0, 255);
  RuleId nl = g.rule("think-end", {{}, g.lit("\n"), g.lit("\n\n")});
  if (mode == ReasoningMode::None) {
    g.alt(root, {Grammar::ref(body)});
  } else {
    // No <tool_call> inside: the output parser would take it for the start of a call in the block.
    RuleId think = text_until(g, "thinking", "</think>", any, {"<tool_call>"});
    if (mode == ReasoningMode::Open) {
      g.alt(root, {Grammar::ref(think), Grammar::ref(nl), Grammar::ref(body)});
    } else {
      g.alt(root, {Grammar::ref(body)});
      g.alt(root, cat({g.lit("<think>"), {Grammar::ref(think), Grammar::ref(nl), Grammar::ref(body)}}));
    }
  }
  g.set_root(root);
  g.check();
}

const json& function_of(const json& tool, size_t i) {
  if (!tool.is_object()) fail("tools[{}] must be an object", i);
  const json* f = &tool;
  if (tool.contains("function")) f = &tool["function"];
  if (!f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
    fail("tools[{}].function.name must be a string", i);
  return *f;
}

bool is_string_schema(const json& s) {
  if (!s.is_object()) return false;
  auto it = s.find("type");
  if (it == s.end()) return false;
  if (it->is_string()) return *it == "string";
  if (it->is_array())
    for (auto& t : *it)
      if (t == "string") return true;
  return false;
}

// Qwen3.5 XML parameters: string values raw, the others JSON; declared order, optional ones skippable.
RuleId xml_parameters(Grammar& g, JsonGrammarBuilder& jb, const json& params, const std::string& where) {
  json props = params.is_object() && params.contains("properties") && params["properties"].is_object() ? params["properties"] : json::object();
  std::set<std::string> required;
  if (params.is_object() && params.contains("required") && params["required"].is_array())
    for (auto& r : params["required"])
      if (r.is_string()) {
        required.insert(r.get<std::string>());
        if (!props.contains(r.get<std::string>())) props[r.get<std::string>()] = json::object();
      }
  ByteSet text = ByteSet::range(0x20, 0xff);
  text.add('\n').add('\t').add('\r');
  RuleId next = g.rule(fmt::format("{}-end", where), {{}});
  std::vector<std::pair<std::string, json>> items;
  for (auto& [k, v] : props.items()) items.emplace_back(k, v);
  for (size_t i = items.size(); i-- > 0;) {
    const auto& [name, schema] = items[i];
    const std::string w = fmt::format("{}/properties/{}", where, name);
    Seq value;
    if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty() &&
        std::all_of(schema["enum"].begin(), schema["enum"].end(), [](const json& v) { return v.is_string(); })) {
      std::vector<Seq> alts;
      for (auto& v : schema["enum"]) alts.push_back(g.lit(v.get<std::string>()));
      value = {Grammar::ref(g.rule(w + "-enum", std::move(alts))), Grammar::ref(g.rule(w + "-close", {g.lit("\n</parameter>")}))};
    } else if (is_string_schema(schema)) {
      value = {Grammar::ref(text_until(g, w + "-text", "\n</parameter>", text))};
    } else {
      value = {Grammar::ref(jb.schema(schema, w)), Grammar::ref(g.rule(w + "-close", {g.lit("\n</parameter>")}))};
    }
    Seq param = cat({g.lit(fmt::format("<parameter={}>\n", name)), value, g.lit("\n"), {Grammar::ref(next)}});
    RuleId r = g.rule(w);
    g.alt(r, param);
    if (!required.count(name)) g.alt(r, {Grammar::ref(next)});
    next = r;
  }
  return next;
}

}  // namespace

Grammar tool_call_grammar(const ToolCallGrammarOptions& opt) {
  if (!opt.tools.is_array() || opt.tools.empty()) fail("tools: a forced tool call needs at least one tool");
  LILY_ASSERT(opt.max_calls >= 1);
  Grammar g;
  JsonGrammarBuilder jb(g);
  std::vector<Seq> calls;
  bool found = false;
  for (size_t i = 0; i < opt.tools.size(); ++i) {
    const json& f = function_of(opt.tools[i], i);
    const std::string name = f["name"].get<std::string>();
    if (!opt.only.empty() && name != opt.only) continue;
    found = true;
    const json params = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : json{{"type", "object"}};
    const std::string where = fmt::format(fmt::runtime(opt.schema_where), i);
    if (opt.syntax == ToolCallSyntax::Json) {
      RuleId args = jb.schema(params, where);
      calls.push_back(cat({g.lit("<tool_call>\n{\"name\": " + json(name).dump() + ", \"arguments\": "), {Grammar::ref(args)},
                           g.lit("}\n</tool_call>")}));
    } else {
      RuleId ps = xml_parameters(g, jb, params, where);
      calls.push_back(cat({g.lit("<tool_call>\n<function=" + name + ">\n"), {Grammar::ref(ps)}, g.lit("</function>\n</tool_call>")}));
    }
  }
  if (!found) fail("tool_choice: no tool named '{}' in tools", opt.only);
  RuleId call = g.rule("tool-call", std::move(calls));
  const std::string sep = opt.syntax == ToolCallSyntax::Json ? "\n" : "\n\n";
  RuleId more = g.rule("more-calls", {{}});
  for (int k = 1; k < opt.max_calls; ++k)
    more = g.rule("more-calls", {{}, cat({g.lit(sep), {Grammar::ref(call), Grammar::ref(more)}})});
  RuleId body = g.rule("tool-calls", {{Grammar::ref(call), Grammar::ref(more)}});
  set_root_after_reasoning(g, opt.reasoning, body);
  return g;
}

Grammar json_output_grammar(const json& schema, const std::string& where, ReasoningMode reasoning) {
  Grammar g;
  JsonGrammarBuilder jb(g);
  RuleId body = schema.is_null() ? jb.any_object() : jb.schema(schema, where);
  set_root_after_reasoning(g, reasoning, body);
  return g;
}

}  // namespace lily::text
