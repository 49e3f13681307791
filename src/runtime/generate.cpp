#include "runtime/generate.h"

#include "core/error.h"
#include "runtime/loop.h"

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

namespace {
class CallbackJob final : public Job {
 public:
  CallbackJob(GenParams p, const TokenCallback& cb) : Job(std::move(p)), cb_(cb) {}
  bool on_token(int32_t t, std::span<const float> logits) override {
    tokens.push_back(t);
    return cb_ ? cb_(t, logits) : true;
  }
  void on_finish(const GenResult& r) override { res = r; }
  std::vector<int32_t> tokens;
  GenResult res;

 private:
  const TokenCallback& cb_;
};
}  // namespace

GenerateResult generate(Session& s, std::span<const int32_t> prompt, const GenerateOptions& opt,
                        const TokenCallback& on_token) {
  GenParams p = opt;
  p.prompt.assign(prompt.begin(), prompt.end());
  p.use_cache = false;
  auto job = std::make_shared<CallbackJob>(std::move(p), on_token);
  GenerationLoop loop(s.engine(), LoopOptions{});
  loop.add(job, s, GenerationLoop::now_ms());
  while (!loop.empty()) loop.step();
  const GenResult& r = job->res;
  if (r.finish_reason == "error") {
    if (r.error_is_input) throw InputError(r.error);
    throw InternalError(r.error);
  }
  GenerateResult out;
  out.tokens = job->tokens;
  if (r.stop_token >= 0) out.tokens.push_back(r.stop_token);
  out.finish_reason = r.finish_reason;
  out.prompt_tokens = r.prompt_tokens - r.cached_tokens;
  out.prefill_seconds = r.prefill_ms / 1e3;
  out.decode_seconds = r.decode_ms / 1e3;
  out.device_sampled = r.device_sampled;
  out.spec = r.spec;
  return out;
}

}  // namespace lily
