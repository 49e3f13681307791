// Token sampling on the host. Greedy when temperature == 0; otherwise penalties, temperature,
// top-k, top-p, min-p, then a draw from a seeded generator (same seed, same tokens).
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace lily {

struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;               // 0: off
  float top_p = 1.0f;          // 1: off
  float min_p = 0.0f;          // 0: off
  float repetition_penalty = 1.0f;  // llama.cpp/HF style: divides positive logits of seen tokens
  float presence_penalty = 0.0f;    // OpenAI style, subtracted once per seen token
  float frequency_penalty = 0.0f;   // OpenAI style, subtracted per occurrence
  std::optional<uint64_t> seed;     // unset: from std::random_device
};

// Throws InputError naming the parameter when out of range.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // `history`: tokens the penalties apply to (prompt + generated, as the caller chooses).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history = {});
  // The distribution sample() would draw from (no draw is made): the kept ids in draw order and their
  // probabilities renormalised over the kept set; greedy: the one id with probability 1.
  std::vector<std::pair<int32_t, double>> distribution(std::span<const float> logits, std::span<const int32_t> history = {});
  const SamplingParams& params() const { return p_; }
  // The generator's next uniform in [0, 1), and a draw from `dist` (probabilities summing to ~1), for
  // speculative verification (runtime/verify.h): same seed, same draws.
  double uniform();
  int32_t draw(std::span<const std::pair<int32_t, double>> dist);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> prob_;
  // Penalties and filters: cand_[0:n] are the kept (logit, id) in draw order, prob_[0:n] their
  // probabilities (normalised over the top-k set). Returns n; greedy: n = 1.
  size_t keep(std::span<const float> logits, std::span<const int32_t> history);
};

// log-softmax of `logits` at `token`, and the top-n (token, logprob) pairs, highest first.
float token_logprob(std::span<const float> logits, int32_t token);
std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, int n);

}  // namespace lily
