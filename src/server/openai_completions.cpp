#include "server/openai_completions.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "text/utf8.h"

namespace lily::server {

namespace {

// Legacy logprobs: parallel arrays, text_offset counted in bytes of the returned text.
json legacy_logprobs(const Core& core, const std::vector<LogprobItem>& items, size_t& offset) {
  const auto& tok = core.tok;
  json o = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  for (auto& it : items) {
    o["tokens"].push_back(piece_text(it));
    o["token_logprobs"].push_back(it.lp ? json(*it.lp) : json(nullptr));
    if (!it.lp) {
      o["top_logprobs"].push_back(nullptr);
    } else {
      json top = json::object();
      for (auto [tid, v] : it.top) {
        std::string s = tok && tid < tok->vocab_size() ? text::utf8_sanitize(tok->token_bytes(tid)) : std::to_string(tid);
        top[s] = v;
      }
      o["top_logprobs"].push_back(top);
    }
    o["text_offset"].push_back(offset);
    offset += it.bytes.size();
  }
  return o;
}

void completions(Core& core, const HttpRequest& req, HttpResponse& res) {
  core.count("completions");
  json b = core.parse_body(req);
  check_model(b, core.opt.model_id);
  CompletionRequest cr = parse_completion_request(b, core.opt.limits);
  const OpenAiSampling& c = cr.common;
  const auto& tok = core.tok;
  GenParams gp;
  std::string prompt_text;
  if (cr.prompt_is_text) {
    core.need_text("a text prompt");
    prompt_text = cr.prompt_text;
    gp.prompt = tok->encode(prompt_text, true);
  } else {
    gp.prompt = cr.prompt_ids;
  }
  core.check_prompt_ids(gp.prompt, "prompt");
  if (!cr.prompt_is_text && tok) {
    bool decodable = std::all_of(gp.prompt.begin(), gp.prompt.end(), [&](int32_t t) { return t < tok->vocab_size(); });
    if (decodable) prompt_text = tok->decode(gp.prompt);
  }
  const bool echo = cr.echo;
  const int lp = cr.logprobs;
  gp.max_tokens = core.max_tokens(c.max_tokens, gp.prompt.size(), "prompt");
  if (!c.max_tokens) gp.max_tokens = std::min<int64_t>(gp.max_tokens, 16);  // OpenAI's default for completions
  gp.sampling = c.sampling;
  gp.logit_bias = c.logit_bias;
  gp.use_cache = c.cache_prompt;
  gp.spec = request_spec(c, core);
  gp.sample_vocab = core.sample_vocab();
  gp.stop_ids = core.stop_ids();
  gp.prompt_logits = echo && lp >= 0;
  gp.token_logits = lp >= 0;
  auto job = core.submit(std::move(gp), c.stops, nullptr, lp, c.stream);

  const std::string id = random_id("cmpl-");
  const int64_t created_at = int64_t(std::time(nullptr));
  const std::string model = core.opt.model_id;
  const Core* cp = &core;

  if (c.stream) {
    bool include_usage = c.include_usage;
    auto chunk = [=](const std::string& text, json lpj, json finish) {
      json ch = {{"id", id}, {"object", "text_completion"}, {"created", created_at}, {"model", model},
                 {"choices", json::array({{{"index", 0}, {"text", text}, {"logprobs", std::move(lpj)},
                                           {"finish_reason", std::move(finish)}}})}};
      if (include_usage) ch["usage"] = nullptr;
      return ch;
    };
    std::vector<std::string> head;
    auto offset = std::make_shared<size_t>(0);
    bool echo_pending = echo && lp >= 0;
    if (echo && lp < 0) {
      head.push_back(Core::sse(chunk(prompt_text, nullptr, nullptr)));
      *offset = prompt_text.size();
    }
    core.stream(res, job, std::move(head), [=](Event& ev, std::vector<std::string>& out) {
      if (ev.kind == Event::Progress) {
        out.push_back(fmt::format(": prefill {}/{}\n\n", ev.done, ev.total));
        return false;
      }
      if (ev.kind == Event::PromptItems) {
        if (echo_pending) {
          std::string t;
          for (auto& it : ev.items) t += it.bytes;
          out.push_back(Core::sse(chunk(text::utf8_sanitize(t), legacy_logprobs(*cp, ev.items, *offset), nullptr)));
        }
        return false;
      }
      if (ev.kind == Event::Delta) {
        json lpj = lp >= 0 ? legacy_logprobs(*cp, ev.items, *offset) : json(nullptr);
        if (lp < 0) *offset += ev.delta.content.size();
        out.push_back(Core::sse(chunk(ev.delta.content, lpj, nullptr)));
        return false;
      }
      if (ev.kind != Event::Final) return false;
      if (ev.result.finish_reason == "error") {
        out.push_back(Core::sse(openai_error_body(Core::result_error(ev.result))));
      } else if (ev.result.finish_reason != "cancelled") {
        out.push_back(Core::sse(chunk("", nullptr, ev.result.finish_reason)));
        if (include_usage) {
          json u = {{"id", id}, {"object", "text_completion"}, {"created", created_at}, {"model", model},
                    {"choices", json::array()}, {"usage", usage_json(ev.result, 0)}};
          out.push_back(Core::sse(u));
        }
      }
      out.push_back("data: [DONE]\n\n");
      return true;
    });
    return;
  }

  std::string text_out;
  std::vector<LogprobItem> prompt_items, items;
  Event fin = core.wait(req, *job, [&](Event& ev) {
    if (ev.kind == Event::PromptItems) {
      for (auto& it : ev.items) prompt_items.push_back(std::move(it));
    } else if (ev.kind == Event::Delta) {
      text_out += ev.delta.content;
      for (auto& it : ev.items) items.push_back(std::move(it));
    }
  });
  const auto& r = fin.result;
  json lpj = nullptr;
  size_t offset = 0;
  if (lp >= 0) {
    std::vector<LogprobItem> all;
    if (echo) all = prompt_items;
    all.insert(all.end(), items.begin(), items.end());
    lpj = legacy_logprobs(core, all, offset);
  }
  std::string full = echo ? prompt_text + text_out : text_out;
  json choice = {{"index", 0}, {"text", full}, {"logprobs", lpj}, {"finish_reason", r.finish_reason}};
  if (cr.return_tokens) choice["tokens"] = fin.ids;
  json out = {{"id", id}, {"object", "text_completion"}, {"created", created_at}, {"model", model},
              {"choices", json::array({choice})}, {"usage", usage_json(r, 0)}, {"timings", timings_json(fin)}};
  res.set(dump_json(out), "application/json");
}

}  // namespace

CompletionRequest parse_completion_request(const json& b, const RequestLimits& limits) {
  CompletionRequest cr;
  cr.common = parse_openai_sampling(b, limits);
  auto* p = field(b, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  auto from_ids = [&](const json& a) {
    for (auto& x : a) {
      if (!x.is_number_integer()) bad("prompt", "a token-id prompt must hold integers");
      int64_t v = x.get<int64_t>();
      if (v < 0 || v > INT32_MAX) bad("prompt", fmt::format("prompt token id {} is out of range", v));
      cr.prompt_ids.push_back(int32_t(v));
    }
  };
  if (p->is_string()) {
    cr.prompt_is_text = true;
    cr.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
    from_ids(*p);
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    cr.prompt_is_text = true;
    cr.prompt_text = (*p)[0].get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array()) {
    from_ids((*p)[0]);
  } else {
    bad("prompt", "'prompt' must be a string, an array of token ids, or an array holding one of those");
  }
  cr.echo = boolean(b, "echo").value_or(false);
  cr.return_tokens = boolean(b, "return_tokens").value_or(false);
  if (auto* l = field(b, "logprobs")) {
    int64_t v = -1;
    if (l->is_boolean()) v = l->get<bool>() ? 0 : -1;
    else if (l->is_number_integer()) v = l->get<int64_t>();
    else bad("logprobs", "'logprobs' must be an integer between 0 and 5");
    if (v < -1 || v > 20) bad("logprobs", "'logprobs' must be an integer between 0 and 20");
    cr.logprobs = int(v);
  }
  if (field(b, "suffix")) bad("suffix", "'suffix' is not supported");
  return cr;
}

void register_openai_completions(Core& core) {
  auto h = [&core](const HttpRequest& req, HttpResponse& res) { completions(core, req, res); };
  core.route("POST", "/v1/completions", h);
  core.route("POST", "/completions", h);
}

}  // namespace lily::server
