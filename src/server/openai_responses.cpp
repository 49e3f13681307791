#include "server/openai_responses.h"

#include <ctime>

#include <fmt/format.h>

#include "server/json_body.h"

namespace lily::server {

namespace {

std::string at(const char* base, size_t i) { return fmt::format("{}[{}]", base, i); }

std::string need_string(const json& o, const char* k, const std::string& where) {
  auto* v = field(o, k);
  if (!v) bad(where + "." + k, fmt::format("{}.{} is required", where, k));
  if (!v->is_string()) bad(where + "." + k, fmt::format("{}.{} must be a string", where, k));
  return v->get<std::string>();
}

// Message content: a string or text parts (input_text, output_text, text, refusal).
std::string content_text(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, fmt::format("{} must be a string or an array of content parts", where));
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string w = fmt::format("{}[{}]", where, i);
    const json& p = c[i];
    if (!p.is_object()) bad(w, fmt::format("{} must be an object", w));
    const std::string t = need_string(p, "type", w);
    if (t == "input_text" || t == "output_text" || t == "text") out += need_string(p, "text", w);
    else if (t == "refusal") out += need_string(p, "refusal", w);
    else bad(w + ".type", fmt::format("{}.type '{}' is not supported (text parts only)", w, t));
  }
  return out;
}

// Input items -> the template's messages. Consecutive assistant-side items (reasoning, an assistant
// message, function calls) form one assistant turn, as chat completions would send it.
json convert_input(const json& in, const RequestLimits& limits) {
  json out = json::array();
  if (in.is_string()) {
    out.push_back({{"role", "user"}, {"content", in.get<std::string>()}});
    return out;
  }
  if (!in.is_array()) bad("input", "'input' must be a string or an array of items");
  json turn;  // the open assistant turn, or null
  auto close = [&] {
    if (!turn.is_null()) out.push_back(std::move(turn));
    turn = nullptr;
  };
  auto open = [&] {
    if (turn.is_null()) turn = {{"role", "assistant"}, {"content", ""}};
    return &turn;
  };
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string w = at("input", i);
    const json& x = in[i];
    if (!x.is_object()) bad(w, fmt::format("{} must be an object", w));
    std::string type = "message";
    if (auto* t = field(x, "type")) {
      if (!t->is_string()) bad(w + ".type", fmt::format("{}.type must be a string", w));
      type = t->get<std::string>();
    }
    if (type == "message") {
      std::string role = need_string(x, "role", w);
      if (role == "developer") role = "system";
      if (role != "user" && role != "system" && role != "assistant")
        bad(w + ".role", fmt::format("{}.role '{}' is not one of user, system, developer, assistant", w, role));
      auto* c = field(x, "content");
      if (!c) bad(w + ".content", fmt::format("{}.content is required", w));
      std::string text = content_text(*c, w + ".content");
      if (role == "assistant") {
        json* t = open();
        if ((*t).contains("tool_calls")) {  // text after calls: a new turn
          close();
          t = open();
        }
        (*t)["content"].get_ref<std::string&>() += text;
      } else {
        close();
        out.push_back({{"role", role}, {"content", text}});
      }
    } else if (type == "function_call") {
      const std::string args = need_string(x, "arguments", w);
      json parsed = args;  // not JSON (or beyond the limits): the template gets the text
      try {
        parsed = parse_json(args, limits.json);
      } catch (const FieldError&) {
      }
      json call = {{"id", need_string(x, "call_id", w)}, {"type", "function"},
                   {"function", {{"name", need_string(x, "name", w)}, {"arguments", std::move(parsed)}}}};
      json* t = open();
      if (!(*t).contains("tool_calls")) (*t)["tool_calls"] = json::array();
      (*t)["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      close();
      auto* o = field(x, "output");
      if (!o) bad(w + ".output", fmt::format("{}.output is required", w));
      out.push_back({{"role", "tool"}, {"content", content_text(*o, w + ".output")}, {"tool_call_id", need_string(x, "call_id", w)}});
    } else if (type == "reasoning") {
      // The reasoning text, or its summary when there is none (encrypted_content is not ours to read).
      auto texts = [&](const char* key) {
        std::string t;
        auto* c = field(x, key);
        if (!c) return t;
        if (!c->is_array()) bad(w + "." + key, fmt::format("{}.{} must be an array", w, key));
        for (size_t k = 0; k < c->size(); ++k) {
          const std::string wk = fmt::format("{}.{}[{}]", w, key, k);
          if (!(*c)[k].is_object()) bad(wk, fmt::format("{} must be an object", wk));
          t += need_string((*c)[k], "text", wk);
        }
        return t;
      };
      std::string text = texts("content");
      if (text.empty()) text = texts("summary");
      if (!turn.is_null() && (!turn["content"].get<std::string>().empty() || turn.contains("tool_calls"))) close();
      json* t = open();
      (*t)["reasoning_content"] = (*t).value("reasoning_content", std::string()) + text;
    } else {
      bad(w + ".type", fmt::format("{}.type '{}' is not supported (message, function_call, function_call_output, reasoning)", w, type));
    }
  }
  close();
  return out;
}

}  // namespace

ResponsesRequest parse_responses_request(const json& b, const RequestLimits& limits) {
  ResponsesRequest r;
  if (auto* m = field(b, "model"); m && !m->is_string()) bad("model", "'model' must be a string");
  auto* in = field(b, "input");
  if (!in) bad("input", "'input' is required");
  r.input = convert_input(*in, limits);
  if (auto* ins = field(b, "instructions")) {
    if (!ins->is_string()) bad("instructions", "'instructions' must be a string");
    r.instructions = ins->get<std::string>();
    r.has_instructions = true;
  }
  if (auto* p = field(b, "previous_response_id")) {
    if (!p->is_string() || p->get<std::string>().empty()) bad("previous_response_id", "'previous_response_id' must be a response id");
    r.previous_response_id = p->get<std::string>();
  }
  r.tools = json::array();
  r.tools_echo = json::array();
  if (auto* t = field(b, "tools")) {
    if (!t->is_array()) bad("tools", "'tools' must be an array");
    check_count("tools", t->size(), limits.tools, "tools");
    for (size_t i = 0; i < t->size(); ++i) {
      const std::string w = at("tools", i);
      const json& x = (*t)[i];
      if (!x.is_object()) bad(w, fmt::format("{} must be an object", w));
      const std::string type = need_string(x, "type", w);
      if (type != "function") bad(w + ".type", fmt::format("{}.type '{}' is not supported (function tools only)", w, type));
      json fn = {{"name", need_string(x, "name", w)}};
      if (auto* d = field(x, "description")) {
        if (!d->is_string()) bad(w + ".description", fmt::format("{}.description must be a string", w));
        fn["description"] = *d;
      }
      if (auto* p = field(x, "parameters")) {
        if (!p->is_object()) bad(w + ".parameters", fmt::format("{}.parameters must be a JSON Schema object", w));
        fn["parameters"] = *p;
      }
      r.tools.push_back({{"type", "function"}, {"function", fn}});
      r.tools_echo.push_back(x);
    }
  }
  r.parallel_tool_calls = boolean(b, "parallel_tool_calls").value_or(true);
  if (auto* tc = field(b, "tool_choice")) {
    r.tool_choice = *tc;
    std::string only;
    bool force = false;
    if (tc->is_string()) {
      const std::string s = *tc;
      if (s == "none") r.tools = json::array();
      else if (s == "required") force = true;
      else if (s != "auto") bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
    } else if (tc->is_object()) {
      if (need_string(*tc, "type", "tool_choice") != "function")
        bad("tool_choice.type", "tool_choice.type must be 'function'");
      only = need_string(*tc, "name", "tool_choice");
      force = true;
      bool found = false;
      for (auto& x : r.tools) found |= x["function"]["name"] == only;
      if (!found) bad("tool_choice.name", fmt::format("tool_choice names '{}', which is not in 'tools'", only));
    } else {
      bad("tool_choice", "'tool_choice' must be a string or an object");
    }
    if (force) {
      if (r.tools.empty()) bad("tool_choice", "tool_choice 'required' needs 'tools'");
      r.constraint.kind = OutputConstraint::ToolCall;
      r.constraint.where = "tools";
      r.constraint.tool_schema_where = "tools[{}].parameters";
      r.constraint.only = only;
      r.constraint.max_calls = r.parallel_tool_calls ? OutputConstraint::kMaxForcedCalls : 1;
    }
  }
  if (auto* tx = field(b, "text")) {
    if (!tx->is_object()) bad("text", "'text' must be an object");
    if (auto* f = field(*tx, "format")) {
      if (!f->is_object()) bad("text.format", "text.format must be an object with a 'type'");
      const std::string t = need_string(*f, "type", "text.format");
      r.text_format = *f;
      if (t == "json_object" || t == "json_schema") {
        if (r.constraint.kind != OutputConstraint::None) bad("text.format", "text.format cannot be combined with a forced tool call");
        if (t == "json_object") {
          r.constraint.kind = OutputConstraint::JsonObject;
        } else {
          auto* s = field(*f, "schema");
          if (!s || !(s->is_object() || s->is_boolean())) bad("text.format.schema", "text.format.schema must be a JSON Schema object");
          r.constraint.kind = OutputConstraint::JsonSchema;
          r.constraint.schema = *s;
        }
        r.constraint.where = "text.format.schema";
      } else if (t != "text") {
        bad("text.format.type", fmt::format("text.format.type '{}' is not one of text, json_object, json_schema", t));
      }
    }
  }
  r.kwargs = json::object();
  if (auto* re = field(b, "reasoning")) {
    if (!re->is_object()) bad("reasoning", "'reasoning' must be an object");
    r.reasoning = {{"effort", re->value("effort", json(nullptr))}, {"summary", re->value("summary", json(nullptr))}};
    if (auto* e = field(*re, "effort")) {
      static const std::vector<std::string> efforts = {"none", "minimal", "low", "medium", "high", "xhigh"};
      if (!e->is_string() || std::find(efforts.begin(), efforts.end(), e->get<std::string>()) == efforts.end())
        bad("reasoning.effort", "reasoning.effort must be none, minimal, low, medium, high or xhigh");
      r.kwargs["enable_thinking"] = !(*e == "none" || *e == "minimal");
    }
  }
  if (auto m = integer(b, "max_output_tokens")) {
    if (*m < 1) bad("max_output_tokens", "'max_output_tokens' must be at least 1");
    r.max_output_tokens = *m;
  }
  r.sampling.temperature = float(number(b, "temperature").value_or(1.0));
  if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2)) bad("temperature", "'temperature' must be between 0 and 2");
  r.sampling.top_p = float(number(b, "top_p").value_or(1.0));
  if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1)) bad("top_p", "'top_p' must be in (0, 1]");
  r.stream = boolean(b, "stream").value_or(false);
  r.store = boolean(b, "store").value_or(true);
  if (auto* md = field(b, "metadata")) {
    if (!md->is_object()) bad("metadata", "'metadata' must be an object");
    r.metadata = *md;
  }
  return r;
}

namespace {

struct Item {
  std::string type;  // reasoning, message, function_call
  std::string id, text, call_id, name;
  bool cut = false;  // the reply ended inside it (max_output_tokens)
};

json item_json(const Item& it, bool done) {
  const char* status = !done ? "in_progress" : it.cut ? "incomplete" : "completed";
  if (it.type == "reasoning") {
    json content = json::array();
    if (done || !it.text.empty()) content.push_back({{"type", "reasoning_text"}, {"text", it.text}});
    return {{"id", it.id}, {"type", "reasoning"}, {"summary", json::array()}, {"content", done ? content : json::array()}, {"status", status}};
  }
  if (it.type == "message") {
    json content = json::array();
    if (done) content.push_back({{"type", "output_text"}, {"text", it.text}, {"annotations", json::array()}, {"logprobs", json::array()}});
    return {{"id", it.id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", content}};
  }
  return {{"id", it.id}, {"type", "function_call"}, {"status", status}, {"call_id", it.call_id}, {"name", it.name},
          {"arguments", done ? it.text : std::string()}};
}

// The conversation's assistant turn for the template, from the reply's items.
json assistant_turn(const std::vector<Item>& items) {
  json t = {{"role", "assistant"}, {"content", ""}};
  std::string reasoning;
  for (auto& it : items) {
    if (it.type == "reasoning") reasoning += it.text;
    else if (it.type == "message") t["content"] = t["content"].get<std::string>() + it.text;
    else {
      if (!t.contains("tool_calls")) t["tool_calls"] = json::array();
      json args = json::parse(it.text, nullptr, false);
      t["tool_calls"].push_back({{"id", it.call_id}, {"type", "function"},
                                 {"function", {{"name", it.name}, {"arguments", args.is_discarded() ? json(it.text) : args}}}});
    }
  }
  if (!reasoning.empty()) t["reasoning_content"] = reasoning;
  return t;
}

struct Reply {
  std::string id;
  int64_t created = 0;
  std::string model;
  const ResponsesRequest* rq = nullptr;
  int64_t max_output_tokens = 0;

  json object(const char* status, const std::vector<Item>& items, const Event* fin) const {
    json output = json::array();
    for (auto& it : items) output.push_back(item_json(it, true));
    json r = {{"id", id}, {"object", "response"}, {"created_at", created}, {"status", status}, {"error", nullptr},
              {"incomplete_details", nullptr}, {"instructions", rq->has_instructions ? json(rq->instructions) : json(nullptr)},
              {"max_output_tokens", rq->max_output_tokens ? json(*rq->max_output_tokens) : json(nullptr)}, {"model", model},
              {"output", output}, {"parallel_tool_calls", rq->parallel_tool_calls},
              {"previous_response_id", rq->previous_response_id.empty() ? json(nullptr) : json(rq->previous_response_id)},
              {"reasoning", rq->reasoning}, {"store", rq->store}, {"temperature", rq->sampling.temperature},
              {"text", {{"format", rq->text_format}}}, {"tool_choice", rq->tool_choice}, {"tools", rq->tools_echo},
              {"top_p", rq->sampling.top_p}, {"truncation", "disabled"}, {"metadata", rq->metadata}, {"usage", nullptr}};
    if (fin) {
      const auto& g = fin->result;
      r["usage"] = {{"input_tokens", g.prompt_tokens}, {"input_tokens_details", {{"cached_tokens", g.cached_tokens}}},
                    {"output_tokens", g.completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", fin->reasoning_tokens}}},
                    {"total_tokens", g.prompt_tokens + g.completion_tokens}};
      if (g.finish_reason == "length") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
      if (g.finish_reason == "error") {
        ApiError e = Core::result_error(g);
        r["error"] = {{"code", e.status >= 500 ? "server_error" : "invalid_prompt"}, {"message", e.message}};
      }
    }
    return r;
  }
};

const char* final_status(const GenResult& g) {
  if (g.finish_reason == "error") return "failed";
  if (g.finish_reason == "length") return "incomplete";
  if (g.finish_reason == "cancelled") return "cancelled";
  return "completed";
}

std::string call_id(const std::string& id) { return id.rfind("call_", 0) == 0 ? id : "call_" + id; }

void responses(Core& core, Structured* st, ResponseStore& store, const HttpRequest& req, HttpResponse& res) {
  core.count("responses");
  json b = core.parse_body(req);
  core.need_text("responses");
  if (!core.chat) bad("", "this model has no chat template (give one with --chat-template FILE)", "no_chat_template");
  auto rq = std::make_shared<ResponsesRequest>(parse_responses_request(b, core.opt.limits));
  // The conversation: the stored one this continues, then the new input; instructions are not carried over.
  json conversation = json::array();
  if (!rq->previous_response_id.empty()) {
    auto prev = store.get(rq->previous_response_id);
    if (!prev)
      bad("previous_response_id", fmt::format("Previous response with id '{}' not found (not stored, or dropped from the store)",
                                              rq->previous_response_id),
          "previous_response_not_found");
    conversation = prev->conversation;
  }
  for (auto& m : rq->input) conversation.push_back(m);
  json messages = json::array();
  if (rq->has_instructions) messages.push_back({{"role", "system"}, {"content", rq->instructions}});
  for (auto& m : conversation) messages.push_back(m);
  ChatPrompt p = render_chat_prompt(core, messages, rq->tools, rq->kwargs, "input");
  GenParams gp;
  gp.prompt = p.ids;
  gp.boundaries = p.boundaries;
  gp.max_tokens = core.max_tokens(rq->max_output_tokens, gp.prompt.size(), "max_output_tokens");
  gp.sampling = rq->sampling;
  gp.sample_vocab = core.sample_vocab();
  gp.stop_ids = core.stop_ids();
  gp.token_logits = false;
  gp.spec = core.opt.spec;
  gp.constraint = output_constraint(st, rq->constraint, rq->tools, p.text, thinking_enabled(rq->kwargs), gp.max_tokens);
  auto job = core.submit(std::move(gp), {}, core.chat->output(p.text, rq->tools), -1, rq->stream, rq->parallel_tool_calls ? 0 : 1);

  auto reply = std::make_shared<Reply>();
  reply->id = random_id("resp_");
  reply->created = int64_t(std::time(nullptr));
  reply->model = core.opt.model_id;
  reply->rq = rq.get();
  auto remember = [&store, rq, reply, conversation](const std::vector<Item>& items, const Event& fin, const json& object) {
    if (!rq->store || fin.result.finish_reason == "error" || fin.result.finish_reason == "cancelled") return;
    json conv = conversation;
    conv.push_back(assistant_turn(items));
    store.put(reply->id, StoredResponse{object, conv});
  };

  // Items from a delta, in order: reasoning, message text, function calls. `on` sees each change:
  // (item index, opened, text added, closed).
  struct Builder {
    std::vector<Item> items;
    int open = -1;
  };

  if (rq->stream) {
    auto bld = std::make_shared<Builder>();
    auto seq = std::make_shared<int64_t>(0);
    auto ev = [seq](const char* type, json data) {
      data["type"] = type;
      data["sequence_number"] = (*seq)++;
      return fmt::format("event: {}\ndata: {}\n\n", type, dump_json(data));
    };
    json skeleton = reply->object("in_progress", {}, nullptr);
    std::vector<std::string> head = {ev("response.created", {{"response", skeleton}}), ev("response.in_progress", {{"response", skeleton}})};
    core.stream(res, job, std::move(head), [=](Event& e, std::vector<std::string>& out) {
      auto close = [&] {
        if (bld->open < 0) return;
        const Item& it = bld->items[size_t(bld->open)];
        const int idx = bld->open;
        if (it.type == "reasoning") {
          out.push_back(ev("response.reasoning_text.done", {{"item_id", it.id}, {"output_index", idx}, {"content_index", 0}, {"text", it.text}}));
          out.push_back(ev("response.content_part.done", {{"item_id", it.id}, {"output_index", idx}, {"content_index", 0},
                                                          {"part", {{"type", "reasoning_text"}, {"text", it.text}}}}));
        } else if (it.type == "message") {
          out.push_back(ev("response.output_text.done", {{"item_id", it.id}, {"output_index", idx}, {"content_index", 0},
                                                         {"text", it.text}, {"logprobs", json::array()}}));
          out.push_back(ev("response.content_part.done",
                           {{"item_id", it.id}, {"output_index", idx}, {"content_index", 0},
                            {"part", {{"type", "output_text"}, {"text", it.text}, {"annotations", json::array()}, {"logprobs", json::array()}}}}));
        }
        out.push_back(ev("response.output_item.done", {{"output_index", idx}, {"item", item_json(it, true)}}));
        bld->open = -1;
      };
      auto text = [&](const char* type, const std::string& all) {
        const bool fresh = bld->open < 0 || bld->items[size_t(bld->open)].type != type;
        const std::string s(fresh ? block_start(all) : std::string_view(all));
        if (s.empty()) return;
        if (fresh) {
          close();
          Item it;
          it.type = type;
          it.id = random_id(std::string(type) == "reasoning" ? "rs_" : "msg_");
          bld->items.push_back(it);
          bld->open = int(bld->items.size() - 1);
          out.push_back(ev("response.output_item.added", {{"output_index", bld->open}, {"item", item_json(it, false)}}));
          json part = std::string(type) == "reasoning"
                          ? json{{"type", "reasoning_text"}, {"text", ""}}
                          : json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}};
          out.push_back(ev("response.content_part.added", {{"item_id", it.id}, {"output_index", bld->open}, {"content_index", 0}, {"part", part}}));
        }
        Item& it = bld->items[size_t(bld->open)];
        it.text += s;
        if (std::string(type) == "reasoning")
          out.push_back(ev("response.reasoning_text.delta", {{"item_id", it.id}, {"output_index", bld->open}, {"content_index", 0}, {"delta", s}}));
        else
          out.push_back(ev("response.output_text.delta", {{"item_id", it.id}, {"output_index", bld->open}, {"content_index", 0},
                                                          {"delta", s}, {"logprobs", json::array()}}));
      };
      if (e.kind == Event::Delta) {
        text("reasoning", e.delta.reasoning);
        text("message", e.delta.content);
        for (auto& t : e.delta.tool_calls) {
          close();
          Item it;
          it.type = "function_call";
          it.id = random_id("fc_");
          it.call_id = call_id(t.id);
          it.name = t.name;
          bld->items.push_back(it);
          const int idx = int(bld->items.size() - 1);
          out.push_back(ev("response.output_item.added", {{"output_index", idx}, {"item", item_json(it, false)}}));
          bld->items.back().text = t.arguments;
          out.push_back(ev("response.function_call_arguments.delta", {{"item_id", it.id}, {"output_index", idx}, {"delta", t.arguments}}));
          out.push_back(ev("response.function_call_arguments.done",
                           {{"item_id", it.id}, {"output_index", idx}, {"name", t.name}, {"arguments", t.arguments}}));
          out.push_back(ev("response.output_item.done", {{"output_index", idx}, {"item", item_json(bld->items.back(), true)}}));
        }
        return false;
      }
      if (e.kind != Event::Final) return false;
      if (e.result.finish_reason == "cancelled") return true;
      if (e.result.finish_reason == "length" && bld->open >= 0) bld->items[size_t(bld->open)].cut = true;
      close();
      const char* status = final_status(e.result);
      json obj = reply->object(status, bld->items, &e);
      remember(bld->items, e, obj);
      const char* type = std::string(status) == "failed" ? "response.failed"
                         : std::string(status) == "incomplete" ? "response.incomplete" : "response.completed";
      out.push_back(ev(type, {{"response", obj}}));
      return true;
    });
    return;
  }

  Builder bld;
  auto add_text = [&](const char* type, const std::string& all) {
    const bool fresh = bld.items.empty() || bld.items.back().type != type || bld.open < 0;
    const std::string s(fresh ? block_start(all) : std::string_view(all));
    if (s.empty()) return;
    if (fresh) {
      Item it;
      it.type = type;
      it.id = random_id(std::string(type) == "reasoning" ? "rs_" : "msg_");
      bld.items.push_back(it);
      bld.open = 0;
    }
    bld.items.back().text += s;
  };
  Event fin = core.wait(req, *job, [&](Event& e) {
    if (e.kind != Event::Delta) return;
    add_text("reasoning", e.delta.reasoning);
    add_text("message", e.delta.content);
    for (auto& t : e.delta.tool_calls) {
      Item it;
      it.type = "function_call";
      it.id = random_id("fc_");
      it.call_id = call_id(t.id);
      it.name = t.name;
      it.text = t.arguments;
      bld.items.push_back(it);
      bld.open = -1;
    }
  });
  if (fin.result.finish_reason == "length" && bld.open >= 0) bld.items.back().cut = true;
  json obj = reply->object(final_status(fin.result), bld.items, &fin);
  remember(bld.items, fin, obj);
  res.set(dump_json(obj), "application/json");
}

}  // namespace

void register_openai_responses(Core& core, std::shared_ptr<Structured> structured, std::shared_ptr<ResponseStore> store) {
  core.route("POST", "/v1/responses", [&core, structured, store](const HttpRequest& req, HttpResponse& res) {
    responses(core, structured.get(), *store, req, res);
  });
  core.route("GET", "/v1/responses/*", [&core, store](const HttpRequest& req, HttpResponse& res) {
    core.count("responses");
    auto r = store->get(req.path_param);
    if (!r) throw ApiError{404, fmt::format("No response with id '{}' is stored", req.path_param), "invalid_request_error", "", "not_found"};
    res.set(dump_json(r->response), "application/json");
  });
  core.route("DELETE", "/v1/responses/*", [&core, store](const HttpRequest& req, HttpResponse& res) {
    core.count("responses");
    if (!store->erase(req.path_param))
      throw ApiError{404, fmt::format("No response with id '{}' is stored", req.path_param), "invalid_request_error", "", "not_found"};
    res.set(dump_json(json{{"id", req.path_param}, {"object", "response"}, {"deleted", true}}), "application/json");
  });
}

}  // namespace lily::server
