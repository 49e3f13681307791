// A generation request as the runtime runs it: its parameters (defined once, whatever drives it: the
// server's scheduler, `lily generate`, `lily chat`, `lily bench`), its result, and the callbacks through
// which its tokens come out.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/constraint.h"
#include "runtime/sampler.h"
#include "runtime/spec.h"

namespace lily {

struct GenParams {
  std::vector<int32_t> prompt;  // appended to the sequence (which may already hold a cached prefix)
  // Prompt positions (0 < p < prompt.size()) where the state is also saved to the prompt cache, e.g.
  // the start of the last message. The end of the prompt and the end of the request are always saved.
  std::vector<size_t> boundaries;
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int32_t sample_vocab = 0;       // ids >= this are never sampled (tokenizer smaller than the model); 0: all
  std::vector<int32_t> stop_ids;  // end of generation (emitted, then the request ends)
  bool penalize_prompt = false;   // whether the penalties count the prompt tokens too
  bool use_cache = true;          // look up and save prompt-cache snapshots (when the runner has a cache)
  bool prompt_logits = false;     // on_prompt_logits for every prompt row (echo + logprobs); no cache
  // on_token needs the logits row of each token (logprobs): the request then samples on the host. When
  // false, a backend with a device sampler draws its tokens and only ids come back.
  bool token_logits = false;
  bool allow_device = true;       // false: always the host sampler
  // Structured output / forced tool call: only ids it allows are drawn; each emitted token advances it.
  std::shared_ptr<TokenConstraint> constraint;
  // Speculative decoding (runtime/spec.h): drafts verified in tentative steps; same tokens (greedy) or
  // the same distribution (sampled) as without.
  SpecParams spec;
};

struct GenResult {
  std::string finish_reason;     // stop, length, cancelled, error
  std::string error;             // message when finish_reason == "error"
  bool error_is_input = false;   // the error was caused by the request (HTTP 400)
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  // queue: arrival to admission; prefill: admission to the prompt absorbed; ttft: admission to the first
  // token; decode: first token to the end
  double queue_ms = 0, prefill_ms = 0, decode_ms = 0, ttft_ms = 0;
  bool device_sampled = false;   // tokens were drawn by the backend's sampler
  int32_t stop_token = -1;       // the stop id that ended the request (not passed to on_token); -1: none
  SpecStats spec;                // speculative rounds (empty mode: speculation off)
};

// One request. Callbacks run on the thread that steps the model and must not block for long.
//
// Emission: tokens come out in order through on_token; the request ends after a token that is a stop id
// (emitted; on_token is not called for it), after on_token returns false ("stop"), after the max_tokens-th
// token or when the context is full ("length"), or when cancelled. End state: the sequence then holds the
// prompt and every emitted token (the stop id included) that the context could hold.
class Job {
 public:
  explicit Job(GenParams p) : params(std::move(p)) {}
  virtual ~Job() = default;

  // Prompt absorbed so far (cached tokens count as absorbed), after every prefill chunk.
  virtual void on_prefill(int64_t done, int64_t total) {}
  // Rows of prompt logits for positions [first, first + rows) when params.prompt_logits.
  virtual void on_prompt_logits(int64_t first, int64_t rows, std::span<const float> logits) {}
  // A sampled token (not a stop id) and the logits row it was drawn from (empty when it was drawn on the
  // device). Return false to stop ("stop").
  virtual bool on_token(int32_t token, std::span<const float> logits) = 0;
  virtual void on_finish(const GenResult& r) = 0;

  void cancel() { cancelled.store(true); }

  GenParams params;
  std::atomic<bool> cancelled{false};
};

}  // namespace lily
