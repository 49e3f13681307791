#include "server/openai_chat.h"

#include <fmt/format.h>

#include "server/json_body.h"
#include "text/utf8.h"

namespace lily::server {

namespace {

json normalize_messages(const json& b, const RequestLimits& limits) {
  auto* m = field(b, "messages");
  if (!m || !m->is_array() || m->empty()) bad("messages", "'messages' must be a non-empty array");
  json out = json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const json& x = (*m)[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!x.is_object()) bad(where, where + " must be an object");
    auto* role = field(x, "role");
    if (!role || !role->is_string()) bad(where + ".role", where + " needs a string 'role'");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      bad(where + ".role", fmt::format("{} has unknown role '{}' (system, developer, user, assistant, tool)", where, r));
    json msg = {{"role", r}};
    std::string content;
    if (auto* cnt = field(x, "content")) {
      if (cnt->is_string()) {
        content = cnt->get<std::string>();
      } else if (cnt->is_array()) {
        for (size_t j = 0; j < cnt->size(); ++j) {
          const json& part = (*cnt)[j];
          const std::string pw = fmt::format("{}.content[{}]", where, j);
          if (part.is_string()) {
            content += part.get<std::string>();
            continue;
          }
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            bad(pw, pw + " must be an object with a string 'type'");
          std::string t = part["type"];
          if (t != "text" && t != "input_text")
            bad(pw + ".type", fmt::format("{}: content part type '{}' is not supported (text only)", pw, t));
          auto* tx = field(part, "text");
          if (!tx || !tx->is_string()) bad(pw + ".text", fmt::format("{}.text must be a string", pw));
          content += tx->get<std::string>();
        }
      } else {
        bad(where + ".content", where + ".content must be a string or an array of text parts");
      }
    } else if (r != "assistant") {
      bad(where + ".content", where + " needs 'content'");
    }
    msg["content"] = content;
    if (r == "assistant") {
      for (const char* k : {"reasoning_content", "reasoning"})
        if (auto* rc = field(x, k); rc && rc->is_string() && !msg.contains("reasoning_content")) msg["reasoning_content"] = *rc;
      if (auto* tcs = field(x, "tool_calls")) {
        if (!tcs->is_array()) bad(where + ".tool_calls", where + ".tool_calls must be an array");
        json calls = json::array();
        for (auto& tc : *tcs) {
          if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object() || !tc["function"].contains("name") ||
              !tc["function"]["name"].is_string())
            bad(where + ".tool_calls", where + ".tool_calls entries need function.name");
          json fn = {{"name", tc["function"]["name"]}};
          json args = tc["function"].value("arguments", json("{}"));
          if (args.is_string()) {
            try {
              fn["arguments"] = parse_json(args.get<std::string>(), limits.json);
            } catch (const FieldError&) {
              fn["arguments"] = args;  // not JSON (or beyond the limits): the template gets the text
            }
          } else {
            fn["arguments"] = args;
          }
          json call = {{"type", "function"}, {"function", fn}};
          if (tc.contains("id")) call["id"] = tc["id"];
          calls.push_back(call);
        }
        if (!calls.empty()) msg["tool_calls"] = calls;
      }
    }
    if (r == "tool") {
      if (auto* id = field(x, "tool_call_id")) msg["tool_call_id"] = *id;
      if (auto* nm = field(x, "name")) msg["name"] = *nm;
    }
    out.push_back(std::move(msg));
  }
  return out;
}

json parse_tools(const json& b, const RequestLimits& limits, OutputConstraint& force) {
  json tools = json::array();
  auto* t = field(b, "tools");
  if (t) {
    if (!t->is_array()) bad("tools", "'tools' must be an array");
    check_count("tools", t->size(), limits.tools, "tools");
    for (size_t i = 0; i < t->size(); ++i) {
      const json& x = (*t)[i];
      const json* type = x.is_object() ? field(x, "type") : nullptr;  // absent or null: "function"
      if (!x.is_object() || (type && *type != "function") || !x.contains("function") || !x["function"].is_object() ||
          !x["function"].contains("name") || !x["function"]["name"].is_string())
        bad(fmt::format("tools[{}]", i), fmt::format("tools[{}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", i));
      tools.push_back(x);
    }
  }
  if (auto* tc = field(b, "tool_choice")) {
    if (tc->is_string()) {
      std::string s = *tc;
      if (s == "none") return json::array();
      if (s != "auto" && s != "required") bad("tool_choice", "'tool_choice' must be none, auto, required or a named function");
      if (s == "required" && tools.empty()) bad("tool_choice", "tool_choice 'required' needs 'tools'");
      if (s == "required") force.kind = OutputConstraint::ToolCall;
    } else if (tc->is_object()) {
      std::string name;
      if (tc->contains("function") && (*tc)["function"].is_object() && (*tc)["function"].contains("name") &&
          (*tc)["function"]["name"].is_string())
        name = (*tc)["function"]["name"];
      else
        bad("tool_choice", "a named tool_choice needs function.name");
      json one = json::array();
      for (auto& x : tools)
        if (x["function"]["name"] == name) one.push_back(x);
      if (one.empty()) bad("tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", name));
      force.kind = OutputConstraint::ToolCall;
      force.only = name;
      return one;
    } else {
      bad("tool_choice", "'tool_choice' must be a string or an object");
    }
  }
  return tools;
}

json chat_logprob(const Core& core, const LogprobItem& it) {
  json top = json::array();
  for (auto [id, lp] : it.top) {
    std::string b = core.tok && id < core.tok->vocab_size() ? core.tok->token_bytes(id) : std::string();
    top.push_back({{"token", text::utf8_sanitize(b)}, {"logprob", lp}, {"bytes", bytes_json(b)}});
  }
  return {{"token", piece_text(it)}, {"logprob", it.lp.value_or(0.0f)}, {"bytes", bytes_json(it.bytes)}, {"top_logprobs", top}};
}

std::string finish_reason(const Event& f) {
  std::string r = f.result.finish_reason;
  if (r == "stop" && f.tool_calls > 0) r = "tool_calls";
  return r;
}

void chat_completions(Core& core, Structured* structured, const HttpRequest& req, HttpResponse& res) {
  core.count("chat");
  json b = core.parse_body(req);
  check_model(b, core.opt.model_id);
  core.need_text("chat");
  if (!core.chat) bad("", "this model has no chat template (give one with --chat-template FILE)", "no_chat_template");
  ChatRequest cr = parse_chat_request(b, core.opt.limits);
  const OpenAiSampling& c = cr.common;
  const auto& chat = core.chat;

  ChatPrompt rendered = render_chat_prompt(core, cr.messages, cr.tools, cr.kwargs, "messages");
  const std::string& prompt = rendered.text;
  GenParams gp;
  gp.prompt = rendered.ids;
  gp.boundaries = rendered.boundaries;
  gp.max_tokens = core.max_tokens(c.max_tokens, gp.prompt.size(), "messages");
  gp.sampling = c.sampling;
  gp.logit_bias = c.logit_bias;
  gp.use_cache = c.cache_prompt;
  gp.spec = request_spec(c, core);
  gp.sample_vocab = core.sample_vocab();
  gp.stop_ids = core.stop_ids();
  gp.token_logits = cr.logprobs;
  gp.constraint = output_constraint(structured, cr.constraint, cr.tools, prompt, thinking_enabled(cr.kwargs), gp.max_tokens);
  auto job = core.submit(std::move(gp), c.stops, chat->output(prompt, cr.tools), cr.logprobs ? cr.top_logprobs : -1, c.stream,
                         cr.max_tool_calls);

  const std::string id = random_id("chatcmpl-");
  const int64_t created_at = int64_t(std::time(nullptr));
  const std::string model = core.opt.model_id;
  const Core* cp = &core;

  if (c.stream) {
    bool include_usage = c.include_usage;
    auto chunk = [=](json delta, json logprobs_v, json finish) {
      json ch = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created_at}, {"model", model},
                 {"system_fingerprint", "lily"},
                 {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs_v)},
                                           {"finish_reason", std::move(finish)}}})}};
      if (include_usage) ch["usage"] = nullptr;
      return ch;
    };
    std::vector<std::string> head = {Core::sse(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))};
    core.stream(res, job, std::move(head), [=](Event& ev, std::vector<std::string>& out) {
      if (ev.kind == Event::Progress) {
        out.push_back(fmt::format(": prefill {}/{}\n\n", ev.done, ev.total));
        return false;
      }
      if (ev.kind == Event::Delta) {
        json lp = nullptr;
        if (!ev.items.empty()) {
          lp = {{"content", json::array()}};
          for (auto& it : ev.items) lp["content"].push_back(chat_logprob(*cp, it));
        }
        auto& d = ev.delta;
        if (!d.reasoning.empty()) out.push_back(Core::sse(chunk({{"reasoning_content", d.reasoning}}, nullptr, nullptr)));
        if (!d.content.empty() || (!lp.is_null() && d.tool_calls.empty()))
          out.push_back(Core::sse(chunk({{"content", d.content}}, lp, nullptr)));
        for (auto& t : d.tool_calls) {
          json tc = {{"index", t.index}, {"function", {{"arguments", t.arguments}}}};
          if (t.first) {
            tc["id"] = t.id;
            tc["type"] = "function";
            tc["function"]["name"] = t.name;
          }
          out.push_back(Core::sse(chunk({{"tool_calls", json::array({tc})}}, nullptr, nullptr)));
        }
        return false;
      }
      if (ev.kind != Event::Final) return false;
      if (ev.result.finish_reason == "error") {
        out.push_back(Core::sse(openai_error_body(Core::result_error(ev.result))));
      } else if (ev.result.finish_reason != "cancelled") {
        json last = chunk(json::object(), nullptr, finish_reason(ev));
        last["timings"] = timings_json(ev);
        out.push_back(Core::sse(last));
        if (include_usage) {
          json u = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created_at}, {"model", model},
                    {"system_fingerprint", "lily"}, {"choices", json::array()},
                    {"usage", usage_json(ev.result, ev.reasoning_tokens)}};
          out.push_back(Core::sse(u));
        }
      }
      out.push_back("data: [DONE]\n\n");
      return true;
    });
    return;
  }

  // Non-streaming: collect everything.
  std::string content, reasoning;
  json tool_calls = json::array();
  json lp_content = json::array();
  Event fin = core.wait(req, *job, [&](Event& ev) {
    if (ev.kind != Event::Delta) return;
    content += ev.delta.content;
    reasoning += ev.delta.reasoning;
    for (auto& t : ev.delta.tool_calls) {
      while (int(tool_calls.size()) <= t.index)
        tool_calls.push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
      auto& tc = tool_calls[size_t(t.index)];
      if (t.first) {
        tc["id"] = t.id;
        tc["function"]["name"] = t.name;
      }
      tc["function"]["arguments"] = tc["function"]["arguments"].get<std::string>() + t.arguments;
    }
    for (auto& it : ev.items) lp_content.push_back(chat_logprob(core, it));
  });
  const auto& r = fin.result;
  json msg = {{"role", "assistant"}, {"content", content}};
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) {
    msg["tool_calls"] = tool_calls;
    if (content.empty()) msg["content"] = nullptr;
  }
  json choice = {{"index", 0}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", finish_reason(fin)}};
  if (cr.logprobs) choice["logprobs"] = {{"content", lp_content}};
  if (cr.return_tokens) choice["tokens"] = fin.ids;
  json out = {{"id", id}, {"object", "chat.completion"}, {"created", created_at}, {"model", model},
              {"system_fingerprint", "lily"}, {"choices", json::array({choice})},
              {"usage", usage_json(r, fin.reasoning_tokens)}, {"timings", timings_json(fin)}};
  res.set(dump_json(out), "application/json");
}

}  // namespace

ChatRequest parse_chat_request(const json& b, const RequestLimits& limits) {
  ChatRequest cr;
  cr.common = parse_openai_sampling(b, limits);
  cr.logprobs = boolean(b, "logprobs").value_or(false);
  cr.return_tokens = boolean(b, "return_tokens").value_or(false);
  int64_t top_lp = integer(b, "top_logprobs").value_or(0);
  if (top_lp < 0 || top_lp > 20) bad("top_logprobs", "'top_logprobs' must be between 0 and 20");
  cr.top_logprobs = int(top_lp);
  if (field(b, "top_logprobs") && !cr.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (auto* rf = field(b, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      bad("response_format", "'response_format' must be an object with a 'type'");
    const std::string t = (*rf)["type"];
    if (t == "json_object") {
      cr.constraint.kind = OutputConstraint::JsonObject;
    } else if (t == "json_schema") {
      auto* js = field(*rf, "json_schema");
      if (!js || !js->is_object()) bad("response_format.json_schema", "response_format.json_schema must be an object with a 'schema'");
      auto* schema = field(*js, "schema");
      if (!schema || !(schema->is_object() || schema->is_boolean()))
        bad("response_format.json_schema.schema", "response_format.json_schema.schema must be a JSON Schema object");
      cr.constraint.kind = OutputConstraint::JsonSchema;
      cr.constraint.schema = *schema;
    } else if (t != "text") {
      bad("response_format.type", fmt::format("response_format type '{}' is not one of text, json_object, json_schema", t));
    }
    cr.constraint.where = "response_format.json_schema.schema";
  }
  cr.messages = normalize_messages(b, limits);
  OutputConstraint force;
  cr.tools = parse_tools(b, limits, force);
  if (!boolean(b, "parallel_tool_calls").value_or(true)) cr.max_tool_calls = 1;
  if (force.kind != OutputConstraint::None) {
    if (cr.constraint.kind != OutputConstraint::None) bad("response_format", "a forced tool call cannot be combined with response_format");
    force.where = "tools";
    force.max_calls = boolean(b, "parallel_tool_calls").value_or(true) ? OutputConstraint::kMaxForcedCalls : 1;
    cr.constraint = force;
  }
  cr.kwargs = json::object();
  if (auto* k = field(b, "chat_template_kwargs")) {
    if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    cr.kwargs = *k;
  }
  if (auto et = boolean(b, "enable_thinking"); et && !cr.kwargs.contains("enable_thinking")) cr.kwargs["enable_thinking"] = *et;
  return cr;
}

void register_openai_chat(Core& core, std::shared_ptr<Structured> structured) {
  auto h = [&core, structured](const HttpRequest& req, HttpResponse& res) { chat_completions(core, structured.get(), req, res); };
  core.route("POST", "/v1/chat/completions", h);
  core.route("POST", "/chat/completions", h);
}

}  // namespace lily::server
