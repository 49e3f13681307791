#include "server/openai_common.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "server/core.h"
#include "text/utf8.h"

namespace lily::server {

namespace {

// The parameter a sampler validation message starts with ("top_p must be ...").
std::string leading_word(const std::string& s) {
  size_t n = 0;
  while (n < s.size() && (std::isalnum(static_cast<unsigned char>(s[n])) || s[n] == '_')) ++n;
  return s.substr(0, n);
}

}  // namespace

OpenAiSampling parse_openai_sampling(const json& b, const RequestLimits& limits) {
  OpenAiSampling c;
  c.sampling.temperature = float(number(b, "temperature").value_or(1.0));
  if (!(c.sampling.temperature >= 0 && c.sampling.temperature <= 2)) bad("temperature", "'temperature' must be between 0 and 2");
  c.sampling.top_p = float(number(b, "top_p").value_or(1.0));
  int64_t top_k = integer(b, "top_k").value_or(0);
  if (top_k < -1) bad("top_k", "'top_k' must be >= 0 (or -1 for off)");
  c.sampling.top_k = top_k < 0 ? 0 : int(std::min<int64_t>(top_k, 1 << 30));
  c.sampling.min_p = float(number(b, "min_p").value_or(0.0));
  c.sampling.presence_penalty = float(number(b, "presence_penalty").value_or(0.0));
  c.sampling.frequency_penalty = float(number(b, "frequency_penalty").value_or(0.0));
  c.sampling.repetition_penalty = float(number(b, "repetition_penalty").value_or(1.0));
  if (auto s = integer(b, "seed")) c.sampling.seed = uint64_t(*s);
  try {
    validate(c.sampling);
  } catch (const InputError& e) {
    bad(leading_word(e.what()), e.what());
  }
  if (auto* n = field(b, "n"); n && !(n->is_number_integer() && n->get<int64_t>() == 1)) bad("n", "only n = 1 is supported");
  if (auto* s = field(b, "stop")) {
    if (s->is_string()) {
      c.stops.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      check_count("stop", s->size(), limits.stop_strings, "strings");
      for (auto& x : *s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        c.stops.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
    for (auto& x : c.stops)
      if (x.size() > limits.stop_string_bytes)
        bad("stop", fmt::format("a stop string may be at most {} bytes (got {})", limits.stop_string_bytes, x.size()), "limit_exceeded");
    std::erase_if(c.stops, [](const std::string& x) { return x.empty(); });
  }
  if (auto* lb = field(b, "logit_bias")) {
    if (!lb->is_object()) bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    check_count("logit_bias", lb->size(), limits.logit_bias, "entries");
    for (auto& [k, v] : lb->items()) {
      char* end = nullptr;
      errno = 0;
      long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end || errno || id < 0 || id > INT32_MAX)
        bad("logit_bias", fmt::format("logit_bias key '{}' is not a token id", k.substr(0, 40)));
      if (!v.is_number() || std::fabs(v.get<double>()) > 100) bad("logit_bias", "logit_bias values must be numbers in [-100, 100]");
      c.logit_bias.emplace_back(int32_t(id), float(v.get<double>()));
    }
  }
  c.max_tokens = integer(b, "max_completion_tokens");
  if (!c.max_tokens) c.max_tokens = integer(b, "max_tokens");
  else if (field(b, "max_tokens")) (void)integer(b, "max_tokens");
  if (c.max_tokens && *c.max_tokens < 1)
    bad(field(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens", "the token limit must be at least 1");
  c.stream = boolean(b, "stream").value_or(false);
  c.cache_prompt = boolean(b, "cache_prompt").value_or(true);
  if (auto* sp = field(b, "spec")) {
    if (!sp->is_string()) bad("spec", "'spec' must be one of \"mtp\", \"ngram\", \"off\"");
    try {
      c.spec = parse_spec_mode(sp->get<std::string>(), "'spec'");
    } catch (const InputError& e) {
      bad("spec", e.what());
    }
  }
  if (auto* sd = field(b, "spec_depth")) {
    if (sd->is_string() && sd->get<std::string>() == "auto") c.spec_depth = 0;
    else if (sd->is_number_integer() && sd->get<int64_t>() >= 1 && sd->get<int64_t>() <= kMaxSpecDepth) c.spec_depth = int(sd->get<int64_t>());
    else bad("spec_depth", fmt::format("'spec_depth' must be an integer in 1..{} or \"auto\"", kMaxSpecDepth));
  }
  if (auto* so = field(b, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    c.include_usage = boolean(*so, "include_usage", "stream_options").value_or(false);
  }
  return c;
}

void check_model(const json& b, const std::string& served) {
  auto* m = field(b, "model");
  if (!m) return;
  if (!m->is_string()) bad("model", "'model' must be a string");
  std::string id = m->get<std::string>();
  if (!id.empty() && id != served)
    throw ApiError{404, fmt::format("The model '{}' does not exist; this server serves '{}'", text::utf8_sanitize(id), served),
                   "invalid_request_error", "model", "model_not_found"};
}

SpecParams request_spec(const OpenAiSampling& c, const Core& core) {
  SpecParams p = core.opt.spec;
  if (c.spec) p.mode = *c.spec;
  if (c.spec_depth) p.depth = *c.spec_depth;
  if (p.mode == SpecMode::Mtp && !core.engine.weights().mtp) bad("spec", core.engine.weights().mtp_absent, "mtp_unavailable");
  return p;
}

json usage_json(const GenResult& r, int reasoning_tokens) {
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"total_tokens", r.prompt_tokens + r.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}}};
}

json timings_json(const Event& fin) {
  const GenResult& r = fin.result;
  int64_t n = r.prompt_tokens - r.cached_tokens;
  auto rate = [](double n, double ms) { return ms > 0 ? n * 1e3 / ms : 0.0; };
  json t = {{"cache_n", r.cached_tokens},
          {"prompt_n", n},
          {"prompt_ms", r.prefill_ms},
          {"prompt_per_second", rate(double(n), r.prefill_ms)},
          {"predicted_n", r.completion_tokens},
          {"predicted_ms", fin.stream_ms},
          {"predicted_per_second", rate(fin.ids.size() > 1 ? double(fin.ids.size() - 1) : 0.0, fin.stream_ms)},
          {"ttft_ms", r.ttft_ms},
          {"queue_ms", r.queue_ms}};
  if (!r.spec.mode.empty()) {  // llama.cpp's draft counts, and ours per position
    t["draft_n"] = r.spec.drafted;
    t["draft_n_accepted"] = r.spec.accepted;
    t["spec"] = r.spec.to_json();
  }
  return t;
}

json bytes_json(const std::string& b) {
  json a = json::array();
  for (unsigned char c : b) a.push_back(int(c));
  return a;
}

std::string piece_text(const LogprobItem& it) { return text::utf8_sanitize(it.bytes); }

}  // namespace lily::server
