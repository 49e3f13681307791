#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace lily {

DeviceSampling device_sampling(const SamplingParams& p) {
  validate(p);
  DeviceSampling d;
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.repetition_penalty = p.repetition_penalty;
  d.presence_penalty = p.presence_penalty;
  d.frequency_penalty = p.frequency_penalty;
  d.seed = p.seed ? *p.seed : (uint64_t(std::random_device{}()) << 32 | std::random_device{}());
  return d;
}

SamplingParams host_sampling(const DeviceSampling& d) {
  SamplingParams p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.repetition_penalty = d.repetition_penalty;
  p.presence_penalty = d.presence_penalty;
  p.frequency_penalty = d.frequency_penalty;
  p.seed = d.seed;
  return p;
}

GenerateResult generate(Session& s, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const TokenCallback& on_token) {
  LILY_CHECK(opt.max_tokens >= 0, "max_tokens must be >= 0 (got {})", opt.max_tokens);
  LILY_CHECK(!prompt.empty() || s.n_tokens() > 0, "the prompt is empty");
  using clock = std::chrono::steady_clock;
  GenerateResult res;
  Sampler sampler(opt.sampling);
  const int64_t V = s.engine().config().vocab;
  std::vector<float> logits(static_cast<size_t>(V));

  auto t0 = clock::now();
  s.prefill(prompt, logits.data());
  s.engine().backend().synchronize();
  res.prompt_tokens = int64_t(prompt.size());
  auto t1 = clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  std::vector<int32_t> history;
  if (opt.penalize_prompt) history = s.tokens();
  res.finish_reason = "length";
  if (opt.allow_device && !opt.need_logits && opt.max_tokens > 0 && s.can_decode_on_device()) {
    DeviceDecode req;
    req.sampling = device_sampling(opt.sampling);
    req.history = history;
    req.stop_ids = opt.stop_ids;
    req.max_tokens = opt.max_tokens;
    DeviceDecodeResult r = s.decode_on_device(req, [&](int32_t tok) { return on_token ? on_token(tok, {}) : true; });
    res.tokens = std::move(r.tokens);
    res.finish_reason = r.stopped ? "stop" : "length";
    s.engine().backend().synchronize();
    res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
    return res;
  }
  for (int64_t i = 0; i < opt.max_tokens; ++i) {
    const int32_t tok = sampler.sample(logits, history);
    res.tokens.push_back(tok);
    history.push_back(tok);
    const bool is_stop = std::find(opt.stop_ids.begin(), opt.stop_ids.end(), tok) != opt.stop_ids.end();
    if (on_token && !on_token(tok, logits)) {
      res.finish_reason = "stop";
      break;
    }
    if (is_stop) {
      res.finish_reason = "stop";
      break;
    }
    if (i + 1 == opt.max_tokens) break;
    if (s.n_tokens() + 1 > s.capacity()) break;  // context full: "length"
    s.decode(tok, logits.data());
  }
  s.engine().backend().synchronize();
  res.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

}  // namespace lily
