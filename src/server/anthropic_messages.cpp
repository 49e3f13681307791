#include "server/anthropic_messages.h"

#include <fmt/format.h>

#include "text/utf8.h"

namespace lily::server {

namespace {

std::string at(const std::string& base, size_t i) { return fmt::format("{}.{}", base, i); }

// `where` is the dotted path of `o` ("" for the body).
std::string child(const std::string& where, const char* k) { return where.empty() ? std::string(k) : where + "." + k; }

const json& need(const json& o, const char* k, const std::string& where) {
  auto* v = field(o, k);
  if (!v) bad(child(where, k), fmt::format("{}: field required", child(where, k)));
  return *v;
}

std::string need_string(const json& o, const char* k, const std::string& where) {
  const json& v = need(o, k, where);
  if (!v.is_string()) bad(child(where, k), fmt::format("{}: must be a string", child(where, k)));
  return v.get<std::string>();
}

std::string block_type(const json& blk, const std::string& where) {
  if (!blk.is_object()) bad(where, fmt::format("{}: a content block must be an object", where));
  return need_string(blk, "type", where);
}

// A string, or text blocks joined (tool_result content, system).
std::string text_content(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, fmt::format("{}: must be a string or an array of text blocks", where));
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    std::string w = at(where, i);
    std::string t = block_type(c[i], w);
    if (t != "text") bad(w + ".type", fmt::format("{}.type: '{}' blocks are not supported here (text only)", w, t));
    out += need_string(c[i], "text", w);
  }
  return out;
}

// Anthropic messages -> the template's messages (system first, tool results as tool messages).
json convert_messages(const json& b) {
  json out = json::array();
  if (auto* s = field(b, "system")) out.push_back({{"role", "system"}, {"content", text_content(*s, "system")}});
  auto* m = field(b, "messages");
  if (!m) bad("messages", "messages: field required");
  if (!m->is_array() || m->empty()) bad("messages", "messages: must be a non-empty array");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& x = (*m)[i];
    const std::string where = at("messages", i);
    if (!x.is_object()) bad(where, fmt::format("{}: must be an object", where));
    const std::string role = need_string(x, "role", where);
    if (role != "user" && role != "assistant")
      bad(where + ".role", fmt::format("{}.role: must be 'user' or 'assistant' (got '{}')", where, role));
    const json& c = need(x, "content", where);
    if (c.is_string()) {
      out.push_back({{"role", role}, {"content", c.get<std::string>()}});
      continue;
    }
    if (!c.is_array()) bad(where + ".content", fmt::format("{}.content: must be a string or an array of content blocks", where));
    if (role == "user") {
      std::string text;
      bool have_text = false;
      auto flush = [&] {
        if (have_text) out.push_back({{"role", "user"}, {"content", text}});
        text.clear();
        have_text = false;
      };
      for (size_t k = 0; k < c.size(); ++k) {
        const std::string w = at(where + ".content", k);
        const std::string t = block_type(c[k], w);
        if (t == "text") {
          text += need_string(c[k], "text", w);
          have_text = true;
        } else if (t == "tool_result") {
          flush();
          json msg = {{"role", "tool"}, {"content", ""}, {"tool_call_id", need_string(c[k], "tool_use_id", w)}};
          if (auto* rc = field(c[k], "content")) msg["content"] = text_content(*rc, w + ".content");
          if (auto* e = field(c[k], "is_error"); e && !e->is_boolean()) bad(w + ".is_error", fmt::format("{}.is_error: must be a boolean", w));
          out.push_back(std::move(msg));
        } else {
          bad(w + ".type", fmt::format("{}.type: '{}' blocks are not supported in user messages (text, tool_result)", w, t));
        }
      }
      flush();
      if (c.empty()) out.push_back({{"role", "user"}, {"content", ""}});
      continue;
    }
    json msg = {{"role", "assistant"}, {"content", ""}};
    std::string text, reasoning;
    json calls = json::array();
    for (size_t k = 0; k < c.size(); ++k) {
      const std::string w = at(where + ".content", k);
      const std::string t = block_type(c[k], w);
      if (t == "text") {
        text += need_string(c[k], "text", w);
      } else if (t == "thinking") {
        reasoning += need_string(c[k], "thinking", w);
      } else if (t == "redacted_thinking") {
        continue;
      } else if (t == "tool_use") {
        const json& input = need(c[k], "input", w);
        if (!input.is_object()) bad(w + ".input", fmt::format("{}.input: must be an object", w));
        calls.push_back({{"id", need_string(c[k], "id", w)}, {"type", "function"},
                         {"function", {{"name", need_string(c[k], "name", w)}, {"arguments", input}}}});
      } else {
        bad(w + ".type", fmt::format("{}.type: '{}' blocks are not supported in assistant messages (text, thinking, tool_use)", w, t));
      }
    }
    msg["content"] = text;
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    if (!calls.empty()) msg["tool_calls"] = calls;
    out.push_back(std::move(msg));
  }
  return out;
}

json convert_tools(const json& b, const RequestLimits& limits) {
  json tools = json::array();
  auto* t = field(b, "tools");
  if (!t) return tools;
  if (!t->is_array()) bad("tools", "tools: must be an array");
  check_count("tools", t->size(), limits.tools, "tools");
  for (size_t i = 0; i < t->size(); ++i) {
    const std::string w = at("tools", i);
    const json& x = (*t)[i];
    if (!x.is_object()) bad(w, fmt::format("{}: must be an object", w));
    if (auto* ty = field(x, "type"); ty && (!ty->is_string() || *ty != "custom"))
      bad(w + ".type", fmt::format("{}.type: only custom tools (name, description, input_schema) are supported", w));
    json fn = {{"name", need_string(x, "name", w)}};
    if (auto* d = field(x, "description")) {
      if (!d->is_string()) bad(w + ".description", fmt::format("{}.description: must be a string", w));
      fn["description"] = *d;
    }
    const json& schema = need(x, "input_schema", w);
    if (!schema.is_object()) bad(w + ".input_schema", fmt::format("{}.input_schema: must be a JSON Schema object", w));
    fn["parameters"] = schema;
    tools.push_back({{"type", "function"}, {"function", fn}});
  }
  return tools;
}

}  // namespace

MessagesRequest parse_messages_request(const json& b, const RequestLimits& limits, bool count_only) {
  MessagesRequest r;
  if (!need(b, "model", "").is_string()) bad("model", "model: must be a string");
  r.messages = convert_messages(b);
  r.tools = convert_tools(b, limits);
  r.kwargs = json::object();
  if (auto* th = field(b, "thinking")) {
    if (!th->is_object()) bad("thinking", "thinking: must be an object");
    const std::string t = need_string(*th, "type", "thinking");
    if (t == "enabled" || t == "adaptive") {
      r.kwargs["enable_thinking"] = true;
      if (t == "enabled") {
        auto budget = integer(*th, "budget_tokens", "thinking");
        if (!budget) bad("thinking.budget_tokens", "thinking.budget_tokens: field required");
        if (*budget < 1) bad("thinking.budget_tokens", "thinking.budget_tokens: must be at least 1");
        r.constraint.thinking_budget = *budget;
      }
    } else if (t == "disabled") {
      r.kwargs["enable_thinking"] = false;
    } else {
      bad("thinking.type", fmt::format("thinking.type: must be 'enabled', 'adaptive' or 'disabled' (got '{}')", t));
    }
  } else {
    r.kwargs["enable_thinking"] = false;  // Anthropic's default: no extended thinking
  }
  if (auto* tc = field(b, "tool_choice")) {
    if (!tc->is_object()) bad("tool_choice", "tool_choice: must be an object with a 'type'");
    const std::string t = need_string(*tc, "type", "tool_choice");
    const bool single = boolean(*tc, "disable_parallel_tool_use", "tool_choice").value_or(false);
    if (t == "none") {
      r.tools = json::array();
    } else if (t == "any" || t == "tool") {
      if (r.tools.empty()) bad("tool_choice", fmt::format("tool_choice: '{}' needs tools", t));
      r.constraint.kind = OutputConstraint::ToolCall;
      r.constraint.where = "tools";
      r.constraint.tool_schema_where = "tools.{}.input_schema";
      r.constraint.max_calls = single ? 1 : OutputConstraint::kMaxForcedCalls;
      if (t == "tool") {
        r.constraint.only = need_string(*tc, "name", "tool_choice");
        bool found = false;
        for (auto& x : r.tools) found |= x["function"]["name"] == r.constraint.only;
        if (!found) bad("tool_choice.name", fmt::format("tool_choice.name: no tool named '{}' in tools", r.constraint.only));
      }
    } else if (t == "auto") {
      if (single && !r.tools.empty()) r.max_tool_calls = 1;
    } else {
      bad("tool_choice.type", fmt::format("tool_choice.type: must be auto, any, tool or none (got '{}')", t));
    }
  }
  if (count_only) return r;
  auto mt = integer(b, "max_tokens");
  if (!mt) bad("max_tokens", "max_tokens: field required");
  if (*mt < 1) bad("max_tokens", "max_tokens: must be at least 1");
  r.max_tokens = *mt;
  r.sampling.temperature = float(number(b, "temperature").value_or(1.0));
  if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 1)) bad("temperature", "temperature: must be between 0 and 1");
  r.sampling.top_p = float(number(b, "top_p").value_or(1.0));
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) bad("top_p", "top_p: must be in (0, 1]");
  int64_t top_k = integer(b, "top_k").value_or(0);
  if (top_k < 0) bad("top_k", "top_k: must be >= 0");
  r.sampling.top_k = int(std::min<int64_t>(top_k, 1 << 30));
  if (auto* s = field(b, "stop_sequences")) {
    if (!s->is_array()) bad("stop_sequences", "stop_sequences: must be an array of strings");
    check_count("stop_sequences", s->size(), limits.stop_strings, "strings");
    for (auto& x : *s) {
      if (!x.is_string()) bad("stop_sequences", "stop_sequences: must be an array of strings");
      if (x.get_ref<const std::string&>().size() > limits.stop_string_bytes)
        bad("stop_sequences", fmt::format("stop_sequences: a stop sequence may be at most {} bytes (got {})", limits.stop_string_bytes,
                                          x.get_ref<const std::string&>().size()), "limit_exceeded");
      if (!x.get<std::string>().empty()) r.stops.push_back(x.get<std::string>());
    }
  }
  if (auto* md = field(b, "metadata"); md && !md->is_object()) bad("metadata", "metadata: must be an object");
  r.stream = boolean(b, "stream").value_or(false);
  return r;
}

json anthropic_error_body(const ApiError& e) {
  std::string type;
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503:
    case 529: type = "overloaded_error"; break;
    default: type = e.status >= 500 ? "api_error" : "invalid_request_error";
  }
  std::string msg = e.message;
  if (!e.param.empty() && msg.rfind(e.param, 0) != 0) msg = e.param + ": " + msg;
  return {{"type", "error"}, {"error", {{"type", type}, {"message", msg}}}};
}

namespace {

void check_version(const HttpRequest& req) {
  if (!req.headers.has("anthropic-version")) return;
  const std::string v = req.header("anthropic-version");
  bool ok = v.size() == 10 && v[4] == '-' && v[7] == '-';
  for (size_t i = 0; ok && i < v.size(); ++i) ok = i == 4 || i == 7 || (v[i] >= '0' && v[i] <= '9');
  if (!ok) bad("anthropic-version", fmt::format("anthropic-version: '{}' is not a version date (YYYY-MM-DD)", text::utf8_sanitize(v.substr(0, 40))));
}

std::string tool_use_id(const std::string& call_id) {
  return call_id.rfind("call_", 0) == 0 ? "toolu_" + call_id.substr(5) : "toolu_" + call_id;
}

json usage_json(const GenResult& r) {
  return {{"input_tokens", r.prompt_tokens - r.cached_tokens}, {"output_tokens", r.completion_tokens},
          {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", r.cached_tokens}};
}

std::pair<std::string, json> stop_reason(const Event& f) {
  if (f.tool_calls > 0) return {"tool_use", nullptr};
  if (f.result.finish_reason == "length") return {"max_tokens", nullptr};
  if (!f.stop_sequence.empty()) return {"stop_sequence", f.stop_sequence};
  return {"end_turn", nullptr};
}

std::string event(const char* name, const json& data) { return fmt::format("event: {}\ndata: {}\n\n", name, dump_json(data)); }

struct Prepared {
  MessagesRequest mr;
  ChatPrompt prompt;
};

Prepared prepare(Core& core, const HttpRequest& req, bool count_only) {
  check_version(req);
  json b = core.parse_body(req);
  core.need_text("messages");
  if (!core.chat) bad("", "this model has no chat template (give one with --chat-template FILE)", "no_chat_template");
  Prepared p;
  p.mr = parse_messages_request(b, core.opt.limits, count_only);
  p.prompt = render_chat_prompt(core, p.mr.messages, p.mr.tools, p.mr.kwargs, "messages");
  return p;
}

void count_tokens(Core& core, const HttpRequest& req, HttpResponse& res) {
  core.count("messages_count_tokens");
  Prepared p = prepare(core, req, true);
  res.set(dump_json(json{{"input_tokens", p.prompt.ids.size()}}), "application/json");
}

void messages(Core& core, Structured* st, const HttpRequest& req, HttpResponse& res) {
  core.count("messages");
  Prepared p = prepare(core, req, false);
  MessagesRequest& mr = p.mr;
  GenParams gp;
  gp.prompt = p.prompt.ids;
  gp.boundaries = p.prompt.boundaries;
  gp.max_tokens = core.max_tokens(mr.max_tokens, gp.prompt.size(), "max_tokens");
  gp.sampling = mr.sampling;
  gp.sample_vocab = core.sample_vocab();
  gp.stop_ids = core.stop_ids();
  gp.token_logits = false;
  gp.spec = core.opt.spec;
  gp.constraint = output_constraint(st, mr.constraint, mr.tools, p.prompt.text, thinking_enabled(mr.kwargs), gp.max_tokens);
  const int64_t prompt_tokens = int64_t(gp.prompt.size());
  std::shared_ptr<GenJob> job;
  try {
    job = core.submit(std::move(gp), mr.stops, core.chat->output(p.prompt.text, mr.tools), -1, mr.stream, mr.max_tool_calls);
  } catch (ApiError& e) {
    if (e.status == 503) {  // Anthropic's "overloaded"
      res.headers.set("Retry-After", std::to_string(core.sched.retry_after_seconds()));
      e.status = 529;
    }
    throw;
  }
  const std::string id = random_id("msg_");
  const std::string model = core.opt.model_id;

  if (mr.stream) {
    struct Open {
      bool started = false;  // message_start sent
      int index = -1;
      std::string kind;  // "text", "thinking" or "" (none open)
    };
    auto open = std::make_shared<Open>();
    // message_start waits for the job's first event: admission's progress event says how much of the
    // prompt the cache held, so its usage is the final one's (input + cache read = the prompt).
    core.stream(res, job, {}, [open, id, model, prompt_tokens](Event& ev, std::vector<std::string>& out) {
      if (!open->started && !(ev.kind == Event::Final && ev.result.finish_reason == "error")) {
        open->started = true;
        const int64_t cached = ev.kind == Event::Progress ? ev.done : ev.kind == Event::Final ? ev.result.cached_tokens : 0;
        json start = {{"type", "message_start"},
                      {"message", {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model}, {"content", json::array()},
                                   {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                                   {"usage", {{"input_tokens", prompt_tokens - cached}, {"output_tokens", 0},
                                              {"cache_creation_input_tokens", 0}, {"cache_read_input_tokens", cached}}}}}};
        out.push_back(event("message_start", start));
        out.push_back(event("ping", {{"type", "ping"}}));
        if (ev.kind == Event::Progress) return false;
      }
      auto close = [&] {
        if (open->kind.empty()) return;
        out.push_back(event("content_block_stop", {{"type", "content_block_stop"}, {"index", open->index}}));
        open->kind.clear();
      };
      auto ensure = [&](const char* kind) {
        if (open->kind == kind) return;
        close();
        ++open->index;
        open->kind = kind;
        json blk = open->kind == "text" ? json{{"type", "text"}, {"text", ""}} : json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
        out.push_back(event("content_block_start", {{"type", "content_block_start"}, {"index", open->index}, {"content_block", blk}}));
      };
      if (ev.kind == Event::Progress) {
        out.push_back(event("ping", {{"type", "ping"}}));
        return false;
      }
      if (ev.kind == Event::PromptItems) return false;
      if (ev.kind == Event::Delta) {
        auto& d = ev.delta;
        const std::string_view thinking = open->kind == "thinking" ? std::string_view(d.reasoning) : block_start(d.reasoning);
        if (!thinking.empty()) {
          ensure("thinking");
          out.push_back(event("content_block_delta", {{"type", "content_block_delta"}, {"index", open->index},
                                                      {"delta", {{"type", "thinking_delta"}, {"thinking", thinking}}}}));
        }
        const std::string_view text = open->kind == "text" ? std::string_view(d.content) : block_start(d.content);
        if (!text.empty()) {
          ensure("text");
          out.push_back(event("content_block_delta", {{"type", "content_block_delta"}, {"index", open->index},
                                                      {"delta", {{"type", "text_delta"}, {"text", text}}}}));
        }
        for (auto& t : d.tool_calls) {
          close();
          ++open->index;
          out.push_back(event("content_block_start", {{"type", "content_block_start"}, {"index", open->index},
                                                      {"content_block", {{"type", "tool_use"}, {"id", tool_use_id(t.id)},
                                                                         {"name", t.name}, {"input", json::object()}}}}));
          out.push_back(event("content_block_delta", {{"type", "content_block_delta"}, {"index", open->index},
                                                      {"delta", {{"type", "input_json_delta"}, {"partial_json", t.arguments}}}}));
          out.push_back(event("content_block_stop", {{"type", "content_block_stop"}, {"index", open->index}}));
        }
        return false;
      }
      if (ev.kind != Event::Final) return false;
      if (ev.result.finish_reason == "error") {
        ApiError e = Core::result_error(ev.result);
        out.push_back(event("error", anthropic_error_body(e)));
        return true;
      }
      if (ev.result.finish_reason == "cancelled") return true;
      if (open->index < 0) ensure("text");  // a reply has at least one block
      close();
      auto [reason, seq] = stop_reason(ev);
      out.push_back(event("message_delta", {{"type", "message_delta"}, {"delta", {{"stop_reason", reason}, {"stop_sequence", seq}}},
                                            {"usage", usage_json(ev.result)}}));
      out.push_back(event("message_stop", {{"type", "message_stop"}}));
      return true;
    });
    return;
  }

  json content = json::array();
  Event fin = core.wait(req, *job, [&](Event& ev) {
    if (ev.kind != Event::Delta) return;
    auto& d = ev.delta;
    auto append = [&](const char* type, const char* key, const std::string& s) {
      if (s.empty()) return;
      if (!content.empty() && content.back()["type"] == type) {
        content.back()[key] = content.back()[key].get<std::string>() + s;
        return;
      }
      const std::string_view first = block_start(s);
      if (first.empty()) return;
      json blk = {{"type", type}, {key, first}};
      if (std::string(type) == "thinking") blk["signature"] = "";
      content.push_back(std::move(blk));
    };
    append("thinking", "thinking", d.reasoning);
    append("text", "text", d.content);
    for (auto& t : d.tool_calls)
      content.push_back({{"type", "tool_use"}, {"id", tool_use_id(t.id)}, {"name", t.name},
                         {"input", json::parse(t.arguments, nullptr, false)}});
  });
  if (content.empty()) content.push_back({{"type", "text"}, {"text", ""}});
  auto [reason, seq] = stop_reason(fin);
  json out = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model}, {"content", content},
              {"stop_reason", reason}, {"stop_sequence", seq}, {"usage", usage_json(fin.result)}};
  res.set(dump_json(out), "application/json");
}

}  // namespace

void register_anthropic_messages(Core& core, std::shared_ptr<Structured> structured) {
  RouteOptions o;
  o.errors = anthropic_error_body;
  core.route("POST", "/v1/messages", [&core, structured](const HttpRequest& req, HttpResponse& res) {
    messages(core, structured.get(), req, res);
  }, o);
  core.route("POST", "/v1/messages/count_tokens", [&core](const HttpRequest& req, HttpResponse& res) { count_tokens(core, req, res); }, o);
  // The rest of the API's paths (batches, other methods) answer in its envelope too.
  o.json_body = false;
  for (const char* m : {"GET", "PUT", "PATCH", "DELETE"})
    core.route(m, "/v1/messages", [](const HttpRequest& req, HttpResponse& res) {
      res.headers.set("Allow", "POST");
      throw ApiError{405, fmt::format("{} /v1/messages: only POST is served", text::utf8_sanitize(req.method)), "invalid_request_error", "", "method_not_allowed"};
    }, o);
  for (const char* m : {"GET", "POST", "PUT", "PATCH", "DELETE"})
    core.route(m, "/v1/messages/*", [](const HttpRequest& req, HttpResponse& res) {
      throw ApiError{404, fmt::format("Unknown route: {} {}", text::utf8_sanitize(req.method), text::utf8_sanitize(req.path)),
                     "not_found_error", "", "not_found"};
    }, o);
}

}  // namespace lily::server
