#include "runtime/sampler_reference.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace lily {

ReferenceSampler::ReferenceSampler(const SamplingParams& p) : p_(p) {
  validate(p);
  rng_.seed(p.seed ? *p.seed : std::random_device{}());
}

size_t ReferenceSampler::keep(std::span<const float> logits, std::span<const int32_t> history) {
  const int64_t V = int64_t(logits.size());
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
  const float mx = cand_[0].first;
  prob_.assign(n, 0.0);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (prob_[i] = std::exp(double(cand_[i].first - mx) / p_.temperature));
  for (auto& v : prob_) v /= sum;
  if (p_.min_p > 0.0f) {
    const double cut = prob_[0] * p_.min_p;
    size_t k = 1;
    while (k < n && prob_[k] >= cut) ++k;
    n = k;
  }
  if (p_.top_p < 1.0f) {
    double c = 0;
    size_t k = 0;
    while (k < n) {
      c += prob_[k++];
      if (c >= p_.top_p) break;
    }
    n = std::max<size_t>(1, k);
  }
  return n;
}

int32_t ReferenceSampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const size_t n = keep(logits, history);
  if (p_.temperature == 0.0f) return cand_[0].second;
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob_[i];
  std::uniform_real_distribution<double> U(0.0, total);
  double r = U(rng_), acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob_[i];
    if (r < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

std::vector<std::pair<int32_t, double>> ReferenceSampler::distribution(std::span<const float> logits,
                                                                       std::span<const int32_t> history) {
  const size_t n = keep(logits, history);
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob_[i];
  std::vector<std::pair<int32_t, double>> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {cand_[i].second, prob_[i] / total};
  return out;
}

}  // namespace lily
