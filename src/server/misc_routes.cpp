#include "server/misc_routes.h"

#include <fmt/format.h>

#include "text/utf8.h"

namespace lily::server {

namespace {

json model_json(const Core& core) {
  const auto& cfg = core.engine.config();
  return {{"id", core.opt.model_id}, {"object", "model"}, {"created", core.created}, {"owned_by", "lily"},
          {"meta", {{"n_ctx", core.sched.ctx_size()}, {"n_vocab", cfg.vocab}, {"n_layers", cfg.layers},
                    {"architecture", arch_name(cfg.arch)}, {"backend", core.engine.backend().name()}}}};
}

void tokenize(Core& core, const HttpRequest& req, HttpResponse& res) {
  core.count("tokenize");
  json b = core.parse_body(req);
  core.need_text("/tokenize");
  const json* c = field(b, "content");
  if (!c) c = field(b, "text");
  if (!c) c = field(b, "prompt");
  if (!c || !c->is_string()) bad("content", "'content' must be a string");
  bool special = boolean(b, "add_special").value_or(false) || boolean(b, "parse_special").value_or(true);
  auto ids = core.tok->encode(c->get<std::string>(), special);
  json out = {{"tokens", ids}};
  if (boolean(b, "with_pieces").value_or(false)) {
    json pieces = json::array();
    for (int32_t t : ids) pieces.push_back({{"id", t}, {"piece", text::utf8_sanitize(core.tok->token_bytes(t))}});
    out["tokens"] = pieces;
  }
  res.set(dump_json(out), "application/json");
}

void detokenize(Core& core, const HttpRequest& req, HttpResponse& res) {
  core.count("detokenize");
  json b = core.parse_body(req);
  core.need_text("/detokenize");
  auto* t = field(b, "tokens");
  if (!t || !t->is_array()) bad("tokens", "'tokens' must be an array of token ids");
  std::vector<int32_t> ids;
  const int64_t n = core.tok->vocab_size();
  for (auto& x : *t) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= n)
      bad("tokens", fmt::format("'{}' is not a token id of this tokenizer (0..{})", dump_json(x), n - 1));
    ids.push_back(int32_t(x.get<int64_t>()));
  }
  res.set(dump_json(json{{"content", core.tok->decode(ids)}}), "application/json");
}

std::string metrics(const Core& core) {
  auto s = core.sched.stats();
  std::string o;
  auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  metric("lily_requests_submitted_total", "counter", "Generation requests accepted into the queue", s.submitted);
  metric("lily_requests_completed_total", "counter", "Generation requests that finished", s.completed);
  metric("lily_requests_cancelled_total", "counter", "Generation requests stopped because the client left", s.cancelled);
  metric("lily_requests_failed_total", "counter", "Generation requests that ended with an error", s.failed);
  metric("lily_requests_rejected_total", "counter", "Requests refused with 503 (queue full)", s.rejected);
  metric("lily_prompt_tokens_total", "counter", "Prompt tokens of finished requests", s.prompt_tokens);
  metric("lily_prefilled_tokens_total", "counter", "Prompt tokens run through the model (not from the cache)", s.prefilled_tokens);
  metric("lily_cached_tokens_total", "counter", "Prompt tokens restored from the prompt cache", s.cached_tokens);
  metric("lily_generated_tokens_total", "counter", "Tokens generated", s.generated_tokens);
  metric("lily_prefill_seconds_total", "counter", "Seconds spent in prefill", s.prefill_seconds);
  metric("lily_decode_seconds_total", "counter", "Seconds of model decode steps (shared by the requests of a step)", s.decode_seconds);
  metric("lily_prefill_tokens_per_second", "gauge", "Prefill throughput over all requests",
         s.prefill_seconds > 0 ? double(s.prefilled_tokens) / s.prefill_seconds : 0.0);
  const auto& ss = core.stream_stats();
  const double stream_s = double(ss.micros.load()) * 1e-6;
  metric("lily_response_decode_seconds_total", "counter",
         "Wall seconds from the first to the last generated token of each finished response", stream_s);
  metric("lily_decode_tokens_per_second", "gauge", "Tokens per second a client receives after its first token, over all responses",
         stream_s > 0 ? double(ss.intervals.load()) / stream_s : 0.0);
  metric("lily_requests_active", "gauge", "Requests holding a slot", s.active);
  metric("lily_queue_depth", "gauge", "Requests waiting for a slot", s.queued);
  metric("lily_prompt_cache_hits_total", "counter", "Prompt cache lookups that found a prefix", s.cache.hits);
  metric("lily_prompt_cache_misses_total", "counter", "Prompt cache lookups that found nothing", s.cache.misses);
  metric("lily_prompt_cache_evictions_total", "counter", "Prompt cache entries evicted", s.cache.evictions);
  metric("lily_prompt_cache_entries", "gauge", "Prompt cache entries", s.cache.entries);
  metric("lily_prompt_cache_bytes", "gauge", "Prompt cache memory", s.cache.bytes);
  metric("lily_spec_rounds_total", "counter", "Speculative verification rounds holding drafts", s.spec.rounds);
  metric("lily_spec_drafted_tokens_total", "counter", "Tokens drafted in speculative rounds", s.spec.drafted);
  metric("lily_spec_accepted_tokens_total", "counter", "Drafted tokens the verification accepted", s.spec.accepted);
  metric("lily_spec_tokens_per_round", "gauge", "Tokens emitted per speculative round", s.spec.tokens_per_round());
  metric("lily_spec_mean_depth", "gauge", "Drafted tokens per speculative round (the chosen depth)", s.spec.mean_depth());
  o += "# HELP lily_spec_acceptance Acceptance at each draft position, given the earlier ones were accepted\n"
       "# TYPE lily_spec_acceptance gauge\n";
  const auto acc = s.spec.acceptance_per_position();
  for (size_t i = 0; i < acc.size(); ++i) o += fmt::format("lily_spec_acceptance{{position=\"{}\"}} {}\n", i + 1, acc[i]);
  o += "# HELP lily_spec_rounds_by_depth_total Speculative rounds by drafted tokens\n# TYPE lily_spec_rounds_by_depth_total counter\n";
  for (size_t k = 1; k < s.spec.depth_rounds.size(); ++k)
    if (s.spec.depth_rounds[k] > 0) o += fmt::format("lily_spec_rounds_by_depth_total{{depth=\"{}\"}} {}\n", k, s.spec.depth_rounds[k]);
  auto counts = core.http_counts();
  o += "# HELP lily_http_requests_total HTTP requests by endpoint\n# TYPE lily_http_requests_total counter\n";
  for (auto& [k, v] : counts.by_endpoint) o += fmt::format("lily_http_requests_total{{endpoint=\"{}\"}} {}\n", k, v);
  o += "# HELP lily_http_responses_total HTTP responses by status\n# TYPE lily_http_responses_total counter\n";
  for (auto& [k, v] : counts.by_status) o += fmt::format("lily_http_responses_total{{status=\"{}\"}} {}\n", k, v);
  return o;
}

}  // namespace

void register_misc_routes(Core& core) {
  core.route("GET", "/v1/models", [&core](const HttpRequest&, HttpResponse& res) {
    core.count("models");
    res.set(dump_json(json{{"object", "list"}, {"data", json::array({model_json(core)})}}), "application/json");
  });
  core.route("GET", "/v1/models/*", [&core](const HttpRequest& req, HttpResponse& res) {
    core.count("models");
    if (req.path_param != core.opt.model_id)
      throw ApiError{404, fmt::format("The model '{}' does not exist", text::utf8_sanitize(req.path_param)), "invalid_request_error",
                     "model", "model_not_found"};
    res.set(dump_json(model_json(core)), "application/json");
  });
  core.route(
      "GET", "/health",
      [&core](const HttpRequest&, HttpResponse& res) {
        auto s = core.sched.stats();
        res.set(dump_json(json{{"status", "ok"}, {"slots_active", s.active}, {"queue", s.queued}}), "application/json");
      },
      RouteOptions{.errors = {}, .open = true, .json_body = false, .quick = true});
  core.route("GET", "/metrics", [&core](const HttpRequest&, HttpResponse& res) { res.set(metrics(core), "text/plain; version=0.0.4"); });
  core.route("POST", "/tokenize", [&core](const HttpRequest& req, HttpResponse& res) { tokenize(core, req, res); });
  core.route("POST", "/detokenize", [&core](const HttpRequest& req, HttpResponse& res) { detokenize(core, req, res); });
}

}  // namespace lily::server
