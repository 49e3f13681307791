#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"

namespace lily {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) fail("temperature must be >= 0 (got {})", p.temperature);
  if (p.top_k < 0) fail("top_k must be >= 0 (got {})", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("top_p must be in (0, 1] (got {})", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("min_p must be in [0, 1] (got {})", p.min_p);
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    fail("repetition_penalty must be > 0 (got {})", p.repetition_penalty);
  if (!(std::fabs(p.presence_penalty) <= 2.0f)) fail("presence_penalty must be in [-2, 2] (got {})", p.presence_penalty);
  if (!(std::fabs(p.frequency_penalty) <= 2.0f)) fail("frequency_penalty must be in [-2, 2] (got {})", p.frequency_penalty);
}

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  validate(p);
  rng_.seed(p.seed ? *p.seed : std::random_device{}());
}

size_t Sampler::keep(std::span<const float> logits, std::span<const int32_t> history) {
  const int64_t V = int64_t(logits.size());
  LILY_ASSERT(V > 0);
  cand_.resize(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) cand_[size_t(i)] = {logits[size_t(i)], int32_t(i)};
  if (!history.empty() && (p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f)) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : history)
      if (t >= 0 && t < V) ++counts[t];
    for (auto [t, c] : counts) {
      float& l = cand_[size_t(t)].first;
      if (p_.repetition_penalty != 1.0f) l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
      l -= p_.presence_penalty + p_.frequency_penalty * float(c);
    }
  }
  if (p_.temperature == 0.0f) {
    // Greedy: highest logit, lowest id on ties.
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (cand_[size_t(i)].first > cand_[size_t(best)].first) best = i;
    std::swap(cand_[0], cand_[size_t(best)]);
    prob_.assign(1, 1.0);
    return 1;
  }
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = size_t(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Probabilities at temperature T over the kept candidates.
  const float mx = cand_[0].first;
  std::vector<double>& prob = prob_;
  prob.assign(n, 0.0);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (prob[i] = std::exp(double(cand_[i].first - mx) / p_.temperature));
  for (auto& v : prob) v /= sum;
  if (p_.min_p > 0.0f) {
    const double cut = prob[0] * p_.min_p;
    size_t k = 1;
    while (k < n && prob[k] >= cut) ++k;
    n = k;
  }
  if (p_.top_p < 1.0f) {
    double c = 0;
    size_t k = 0;
    while (k < n) {
      c += prob[k++];
      if (c >= p_.top_p) break;
    }
    n = std::max<size_t>(1, k);
  }
  return n;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const size_t n = keep(logits, history);
  if (p_.temperature == 0.0f) return cand_[0].second;
  const std::vector<double>& prob = prob_;
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob[i];
  std::uniform_real_distribution<double> U(0.0, total);
  double r = U(rng_), acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob[i];
    if (r < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

std::vector<std::pair<int32_t, double>> Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history) {
  const size_t n = keep(logits, history);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob_[i];
  std::vector<std::pair<int32_t, double>> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {cand_[i].second, prob_[i] / total};
  return out;
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

int32_t Sampler::draw(std::span<const std::pair<int32_t, double>> dist) {
  LILY_ASSERT(!dist.empty());
  double total = 0;
  for (const auto& [id, pr] : dist) total += pr;
  const double r = uniform() * total;
  double acc = 0;
  int32_t last = dist.front().first;  // the last id with positive probability (rounding at the end)
  for (const auto& [id, pr] : dist) {
    if (pr <= 0) continue;
    acc += pr;
    last = id;
    if (r < acc) return id;
  }
  return last;
}

float token_logprob(std::span<const float> logits, int32_t token) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double s = 0;
  for (float l : logits) s += std::exp(double(l - mx));
  return float(double(logits[size_t(token)] - mx) - std::log(s));
}

std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, int n) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double s = 0;
  for (float l : logits) s += std::exp(double(l - mx));
  const double lse = double(mx) + std::log(s);
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
  n = std::min<int>(n, int(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < n; ++i) out.push_back({idx[size_t(i)], float(double(logits[size_t(idx[size_t(i)])]) - lse)});
  return out;
}

}  // namespace lily
