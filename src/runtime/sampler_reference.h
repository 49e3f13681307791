// The plain definition the host Sampler (sampler.h) is held to: every candidate sorted by (logit desc,
// id asc), probabilities over the top-k set, min-p, top-p, and a walk in order; what the sampler did
// before it stopped sorting the vocabulary. For tests and `lily bench --sampler`, not for generation.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "runtime/sampler.h"

namespace lily {

class ReferenceSampler {
 public:
  explicit ReferenceSampler(const SamplingParams& p);
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history = {});
  std::vector<std::pair<int32_t, double>> distribution(std::span<const float> logits, std::span<const int32_t> history = {});

 private:
  size_t keep(std::span<const float> logits, std::span<const int32_t> history);
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> prob_;
};

}  // namespace lily
