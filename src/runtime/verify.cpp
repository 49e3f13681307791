#include "runtime/verify.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"

namespace lily {

namespace {

double prob_of(std::span<const std::pair<int32_t, double>> dist, int32_t id) {
  for (const auto& [t, pr] : dist)
    if (t == id) return pr;
  return 0.0;
}

}  // namespace

std::vector<std::pair<int32_t, double>> residual(std::span<const std::pair<int32_t, double>> p,
                                                 std::span<const std::pair<int32_t, double>> q, int32_t d) {
  std::unordered_map<int32_t, double> qm;
  if (q.empty()) qm[d] = 1.0;
  for (const auto& [t, pr] : q) qm[t] += pr;
  std::vector<std::pair<int32_t, double>> r;
  double sum = 0;
  for (const auto& [t, pr] : p) {
    auto it = qm.find(t);
    const double v = pr - (it == qm.end() ? 0.0 : it->second);
    if (v > 0) {
      r.push_back({t, v});
      sum += v;
    }
  }
  if (!(sum > 0)) return {};
  for (auto& [t, v] : r) v /= sum;
  return r;
}

Verdict verify_draft(Sampler& s, std::span<const float> row, std::span<const int32_t> history, int32_t d,
                     std::span<const std::pair<int32_t, double>> q, float typical) {
  Verdict v;
  if (s.params().temperature == 0.0f) {  // the token plain decoding would emit
    v.token = s.sample(row, history);
    v.accepted = v.token == d;
    return v;
  }
  const auto p = s.distribution(row, history);
  const double pd = prob_of(p, d);
  if (typical > 0.0f) {
    double H = 0;
    for (const auto& [t, pr] : p)
      if (pr > 0) H -= pr * std::log(pr);
    const double cut = std::min(double(typical), std::sqrt(double(typical)) * std::exp(-H));
    if (pd > 0 && pd >= cut) return {d, true};
    return {s.draw(p), false};
  }
  const double qd = q.empty() ? 1.0 : prob_of(q, d);
  const double u = s.uniform();
  if (pd > 0 && (qd <= 0 || u * qd < pd)) return {d, true};
  const auto r = residual(p, q, d);
  v.token = r.empty() ? s.draw(p) : s.draw(r);
  return v;
}

}  // namespace lily
