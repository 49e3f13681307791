#include "text/output_parser.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace lily::text {

using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>", kToolOpen = "<tool_call>",
                           kToolClose = "</tool_call>", kFuncOpen = "<function=", kFuncClose = "</function>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest proper suffix of `s` that is a prefix of one of `tags`.
size_t partial_tag_suffix(std::string_view s, std::initializer_list<std::string_view> tags) {
  size_t best = 0;
  for (auto t : tags) {
    if (t.empty()) continue;
    for (size_t k = std::min(s.size(), t.size() - 1); k > best; --k)
      if (s.substr(s.size() - k) == t.substr(0, k)) {
        best = k;
        break;
      }
  }
  return best;
}

// Python literals (True / False / None) outside strings become JSON ones.
std::string repair_python_literals(std::string_view s) {
  std::string out;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_str) {
      out += c;
      if (c == '\\' && i + 1 < s.size()) out += s[++i];
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    auto word = [&](std::string_view w, std::string_view rep) {
      if (s.substr(i, w.size()) != w) return false;
      bool left = i == 0 || !std::isalnum(uint8_t(s[i - 1]));
      bool right = i + w.size() >= s.size() || !std::isalnum(uint8_t(s[i + w.size()]));
      if (!left || !right) return false;
      out += rep;
      i += w.size() - 1;
      return true;
    };
    if (word("True", "true") || word("False", "false") || word("None", "null")) continue;
    out += c;
  }
  return out;
}

std::optional<ojson> parse_json_lenient(std::string_view s) {
  auto t = trim(s);
  if (t.empty()) return std::nullopt;
  auto j = ojson::parse(t, nullptr, false);
  if (!j.is_discarded()) return j;
  j = ojson::parse(repair_python_literals(t), nullptr, false);
  if (!j.is_discarded()) return j;
  return std::nullopt;
}

std::vector<std::string> schema_types(const ojson& schema) {
  std::vector<std::string> types;
  if (!schema.is_object()) return types;
  if (schema.contains("type")) {
    const auto& t = schema["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    else if (t.is_array())
      for (auto& x : t)
        if (x.is_string()) types.push_back(x.get<std::string>());
  } else if (schema.contains("properties")) {
    types.push_back("object");
  } else if (schema.contains("items")) {
    types.push_back("array");
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (schema.contains(k) && schema[k].is_array())
      for (auto& sub : schema[k])
        for (auto& t : schema_types(sub)) types.push_back(t);
  return types;
}

bool matches(const ojson& v, const std::string& t) {
  if (t == "string") return v.is_string();
  if (t == "integer") return v.is_number_integer();
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "null") return v.is_null();
  return false;
}

std::optional<ojson> parse_number(std::string_view s, bool integer_only) {
  auto t = std::string(trim(s));
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long i = std::strtoll(t.c_str(), &end, 10);
  if (end == t.c_str() + t.size() && errno == 0) return ojson(int64_t(i));
  double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(d)) return std::nullopt;
  if (integer_only) {
    if (d != std::floor(d) || std::fabs(d) > 9e15) return std::nullopt;
    return ojson(int64_t(d));
  }
  return ojson(d);
}

}  // namespace

void ParsedDelta::append(ParsedDelta&& o) {
  content += o.content;
  reasoning += o.reasoning;
  for (auto& c : o.tool_calls) tool_calls.push_back(std::move(c));
}

ojson tool_parameters(const ojson& tools, const std::string& name) {
  if (!tools.is_array()) return nullptr;
  for (auto& t : tools) {
    const ojson* f = &t;
    if (t.is_object() && t.contains("function") && t["function"].is_object()) f = &t["function"];
    if (f->is_object() && f->contains("name") && (*f)["name"] == name)
      return f->contains("parameters") ? (*f)["parameters"] : ojson(nullptr);
  }
  return nullptr;
}

ojson coerce_to_schema(const ojson& value, const ojson& schema) {
  auto types = schema_types(schema);
  if (types.empty()) return value;
  for (auto& t : types) {
    if (!matches(value, t)) continue;
    if (t == "object" && schema.contains("properties") && schema["properties"].is_object()) {
      ojson out = ojson::object();
      for (auto it = value.begin(); it != value.end(); ++it) {
        const auto& props = schema["properties"];
        out[it.key()] = props.contains(it.key()) ? coerce_to_schema(it.value(), props[it.key()]) : it.value();
      }
      return out;
    }
    if (t == "array" && schema.contains("items") && schema["items"].is_object()) {
      ojson out = ojson::array();
      for (auto& x : value) out.push_back(coerce_to_schema(x, schema["items"]));
      return out;
    }
    return value;
  }
  for (auto& t : types) {
    if (value.is_string()) {
      const std::string& s = value.get_ref<const std::string&>();
      auto ts = trim(s);
      if (t == "integer" || t == "number") {
        if (auto n = parse_number(s, t == "integer")) return *n;
      } else if (t == "boolean") {
        if (ts == "true" || ts == "True") return true;
        if (ts == "false" || ts == "False") return false;
      } else if (t == "null") {
        if (ts == "null" || ts == "None") return nullptr;
      } else if (t == "object" || t == "array") {
        auto j = parse_json_lenient(s);
        if (j && matches(*j, t)) return coerce_to_schema(*j, schema);
      }
    } else if (t == "string" && (value.is_number() || value.is_boolean())) {
      return value.dump();
    } else if (t == "integer" && value.is_number_float()) {
      double d = value.get<double>();
      if (d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
    } else if (t == "number" && value.is_boolean()) {
      continue;
    }
  }
  return value;
}

std::optional<ToolCall> parse_tool_call(std::string_view body, const ojson& tools) {
  auto t = trim(body);
  ToolCall call;
  call.raw = std::string(t);
  if (t.substr(0, kFuncOpen.size()) == kFuncOpen) {
    size_t gt = t.find('>');
    if (gt == std::string_view::npos) return std::nullopt;
    call.name = std::string(trim(t.substr(kFuncOpen.size(), gt - kFuncOpen.size())));
    if (call.name.empty()) return std::nullopt;
    ojson params = tool_parameters(tools, call.name);
    ojson props = params.is_object() && params.contains("properties") ? params["properties"] : ojson(nullptr);
    std::string_view rest = t.substr(gt + 1);
    size_t fend = rest.find(kFuncClose);
    if (fend != std::string_view::npos) {
      if (!trim(rest.substr(fend + kFuncClose.size())).empty()) return std::nullopt;
      rest = rest.substr(0, fend);
    }
    constexpr std::string_view kParOpen = "<parameter=", kParClose = "</parameter>";
    while (true) {
      size_t p = rest.find(kParOpen);
      if (p == std::string_view::npos) {
        if (!trim(rest).empty()) return std::nullopt;
        break;
      }
      if (!trim(rest.substr(0, p)).empty()) return std::nullopt;
      rest = rest.substr(p + kParOpen.size());
      size_t q = rest.find('>');
      if (q == std::string_view::npos) return std::nullopt;
      std::string pname(trim(rest.substr(0, q)));
      rest = rest.substr(q + 1);
      size_t e = rest.find(kParClose);
      std::string_view val;
      if (e == std::string_view::npos) {  // unterminated: up to the next parameter or the end
        size_t nx = rest.find(kParOpen);
        val = rest.substr(0, nx);
        rest = nx == std::string_view::npos ? std::string_view() : rest.substr(nx);
      } else {
        val = rest.substr(0, e);
        rest = rest.substr(e + kParClose.size());
      }
      if (!val.empty() && val.front() == '\n') val.remove_prefix(1);
      if (!val.empty() && val.back() == '\n') val.remove_suffix(1);
      ojson v = std::string(val);
      if (props.is_object() && props.contains(pname))  // "null" is null whatever the declared type (as vLLM reads it)
        v = trim(val) == "null" ? ojson(nullptr) : coerce_to_schema(v, props[pname]);
      call.arguments[pname] = v;
    }
    return call;
  }
  if (t.empty() || t.front() != '{') return std::nullopt;
  auto j = parse_json_lenient(t);
  if (!j || !j->is_object() || !j->contains("name") || !(*j)["name"].is_string()) return std::nullopt;
  call.name = (*j)["name"].get<std::string>();
  ojson args = j->contains("arguments") ? (*j)["arguments"] : j->contains("parameters") ? (*j)["parameters"] : ojson::object();
  if (args.is_string()) {
    auto parsed = parse_json_lenient(args.get<std::string>());
    if (!parsed) return std::nullopt;
    args = *parsed;
  }
  if (args.is_null()) args = ojson::object();
  if (!args.is_object()) return std::nullopt;
  ojson params = tool_parameters(tools, call.name);
  call.arguments = params.is_object() ? coerce_to_schema(args, params) : args;
  return call;
}

bool prompt_opens_thinking(std::string_view prompt) {
  size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string_view::npos) return false;
  size_t close = prompt.rfind(kThinkClose);
  return close == std::string_view::npos || close < open;
}

OutputParser::OutputParser(OutputParserOptions opts) : opts_(std::move(opts)) {
  if (opts_.parse_reasoning && opts_.start_in_reasoning) mode_ = Mode::Reasoning;
}

ParsedDelta OutputParser::feed(std::string_view text) {
  ParsedDelta d;
  buf_ += text;
  step(d, false);
  return d;
}

ParsedDelta OutputParser::finish() {
  ParsedDelta d;
  step(d, true);
  if (mode_ == Mode::Content && !held_ws_.empty() && content_started_) d.content += held_ws_;
  held_ws_.clear();
  return d;
}

void OutputParser::emit_content(ParsedDelta& d, std::string_view s) {
  if (strip_content_ws_) {
    while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
    if (s.empty()) return;
    strip_content_ws_ = false;
  }
  if (s.empty()) return;
  size_t e = s.size();
  while (e > 0 && is_ws(s[e - 1])) --e;
  if (e == 0) {
    held_ws_ += s;
    return;
  }
  d.content += held_ws_;
  d.content += s.substr(0, e);
  held_ws_ = std::string(s.substr(e));
  content_started_ = true;
}

void OutputParser::emit_reasoning(ParsedDelta& d, std::string_view s, bool closing) {
  if (!reasoning_started_) {
    while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
    if (s.empty()) return;
    reasoning_started_ = true;
  }
  size_t e = s.size();
  while (e > 0 && s[e - 1] == '\n') --e;
  if (e == 0) {
    if (!closing) held_ws_ += s;
    return;
  }
  d.reasoning += held_ws_;
  d.reasoning += s.substr(0, e);
  held_ws_ = closing ? std::string() : std::string(s.substr(e));
}

void OutputParser::close_tool(ParsedDelta& d, bool terminated) {
  auto call = parse_tool_call(tool_text_, opts_.tools);
  const bool in_reasoning = tool_in_reasoning_;
  tool_in_reasoning_ = false;
  if (call) {
    d.tool_calls.push_back(std::move(*call));
  } else if (in_reasoning) {  // not a call after all: its text stays reasoning (the tags dropped)
    emit_reasoning(d, tool_text_, false);
    tool_text_.clear();
    return;
  } else {
    d.content += held_ws_;
    held_ws_.clear();
    if (!tool_bare_) d.content += kToolOpen;
    d.content += tool_text_;
    if (terminated && !tool_bare_) d.content += kToolClose;
    content_started_ = true;
  }
  tool_text_.clear();
  strip_content_ws_ = true;
}

void OutputParser::step(ParsedDelta& d, bool final) {
  while (true) {
    if (mode_ == Mode::Content) {
      std::string_view think_open = opts_.parse_reasoning ? kThinkOpen : "";
      std::string_view think_close = opts_.parse_reasoning ? kThinkClose : "";
      std::string_view tool_open = opts_.parse_tool_calls ? kToolOpen : "";
      std::string_view tool_close = opts_.parse_tool_calls ? kToolClose : "";
      std::string_view func_open = opts_.parse_tool_calls ? kFuncOpen : "";
      size_t best = std::string::npos;
      std::string_view tag;
      for (auto t : {think_open, think_close, tool_open, tool_close, func_open}) {
        if (t.empty()) continue;
        size_t p = buf_.find(t);
        if (p < best) best = p, tag = t;
      }
      if (best == std::string::npos) {
        size_t keep = final ? 0 : partial_tag_suffix(buf_, {think_open, think_close, tool_open, tool_close, func_open});
        emit_content(d, std::string_view(buf_).substr(0, buf_.size() - keep));
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      emit_content(d, std::string_view(buf_).substr(0, best));
      buf_.erase(0, best + tag.size());
      if (tag == kThinkOpen) {
        if (content_started_) d.content += held_ws_;
        held_ws_.clear();
        mode_ = Mode::Reasoning;
        reasoning_started_ = false;
      } else if (tag == kThinkClose || tag == kToolClose) {
        strip_content_ws_ = !content_started_ || strip_content_ws_;  // a stray closing tag is dropped
      } else {
        held_ws_.clear();  // whitespace between content and a tool call is not content
        mode_ = Mode::Tool;
        tool_bare_ = tag == kFuncOpen;
        tool_text_ = tool_bare_ ? std::string(kFuncOpen) : std::string();
      }
      continue;
    }
    if (mode_ == Mode::Reasoning) {
      size_t p = buf_.find(kThinkClose);
      // A tool call written inside the block (or right after <think>, never closed) is still a call.
      std::string_view tool_open = opts_.parse_tool_calls ? kToolOpen : "";
      size_t q = tool_open.empty() ? std::string::npos : buf_.find(tool_open);
      if (q < p) {
        emit_reasoning(d, std::string_view(buf_).substr(0, q), false);
        buf_.erase(0, q + kToolOpen.size());
        mode_ = Mode::Tool;
        tool_bare_ = false;
        tool_in_reasoning_ = true;
        tool_text_.clear();
        continue;
      }
      if (p == std::string::npos) {
        size_t keep = final ? 0 : partial_tag_suffix(buf_, {kThinkClose, tool_open});
        emit_reasoning(d, std::string_view(buf_).substr(0, buf_.size() - keep), final);
        buf_.erase(0, buf_.size() - keep);
        if (final) mode_ = Mode::Content;
        return;
      }
      emit_reasoning(d, std::string_view(buf_).substr(0, p), true);
      buf_.erase(0, p + kThinkClose.size());
      held_ws_.clear();
      mode_ = Mode::Content;
      strip_content_ws_ = true;
      content_started_ = false;
      continue;
    }
    // Tool
    std::string_view end = tool_bare_ ? kFuncClose : kToolClose;
    size_t p = buf_.find(end);
    if (p == std::string::npos) {
      size_t keep = final ? 0 : partial_tag_suffix(buf_, {end});
      tool_text_.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      if (final) {
        close_tool(d, false);
        mode_ = Mode::Content;
      }
      return;
    }
    tool_text_.append(buf_, 0, p);
    if (tool_bare_) tool_text_ += kFuncClose;
    buf_.erase(0, p + end.size());
    const bool back_to_reasoning = tool_in_reasoning_;
    close_tool(d, true);
    mode_ = back_to_reasoning ? Mode::Reasoning : Mode::Content;
  }
}

}  // namespace lily::text
