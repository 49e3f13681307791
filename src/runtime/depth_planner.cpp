#include "runtime/depth_planner.h"

#include <algorithm>

#include "core/error.h"

namespace lily {

namespace {
constexpr double kEma = 0.2;          // weight of a new measurement
constexpr double kDecay = 0.97;       // acceptance counts fade per round (recent text matters more)
constexpr double kPriorWeight = 2.0;  // rounds' worth of the prior acceptance
constexpr double kPriorFirst = 0.7;   // prior acceptance at position 0; deeper positions: the one before
constexpr double kPriorSlope = 0.15;  // verification cost per extra row, relative, with one measured point
}  // namespace

void RoundCosts::add_verify(int k, double ms) {
  LILY_ASSERT(k >= 0);
  if (ms_.size() <= size_t(k)) {
    ms_.resize(size_t(k) + 1, 0.0);
    n_.resize(size_t(k) + 1, 0);
  }
  double& m = ms_[size_t(k)];
  m = n_[size_t(k)] == 0 ? ms : (1 - kEma) * m + kEma * ms;
  ++n_[size_t(k)];
}

void RoundCosts::add_draft(double ms) {
  draft_ = draft_n_ == 0 ? ms : (1 - kEma) * draft_ + kEma * ms;
  ++draft_n_;
}

double RoundCosts::verify_ms(int k) const {
  if (measured(k)) return ms_[size_t(k)];
  // least-squares line through the measured points
  double sw = 0, sk = 0, sm = 0, skk = 0, skm = 0;
  int distinct = 0;
  for (size_t j = 0; j < ms_.size(); ++j) {
    if (n_[j] == 0) continue;
    ++distinct;
    const double x = double(j), y = ms_[j];
    sw += 1;
    sk += x;
    sm += y;
    skk += x * x;
    skm += x * y;
  }
  if (distinct == 0) return 0.0;
  if (distinct == 1) {
    const double k0 = sk, m0 = sm;
    const double base = m0 / (1 + kPriorSlope * k0);  // the one-row cost the point implies
    return base * (1 + kPriorSlope * double(k));
  }
  const double slope = (sw * skm - sk * sm) / (sw * skk - sk * sk);
  const double icpt = (sm - slope * sk) / sw;
  return std::max(icpt + slope * double(k), 1e-6);
}

std::vector<double> RoundCosts::round_ms(int kmax, bool mtp) const {
  std::vector<double> t(size_t(kmax) + 1);
  for (int k = 0; k <= kmax; ++k) t[size_t(k)] = verify_ms(k) + (mtp ? double(k) * draft_ : 0.0);
  return t;
}

double DepthPlanner::expected_tokens(std::span<const double> alpha, int k) {
  double e = 1, run = 1;
  for (int j = 0; j < k; ++j) {
    const double a = alpha.empty() ? 0.0 : alpha[std::min(size_t(j), alpha.size() - 1)];
    run *= a;
    e += run;
  }
  return e;
}

int DepthPlanner::best_depth(std::span<const double> round_ms, std::span<const double> alpha, int kmax) {
  int best = 0;
  double best_rate = -1;
  const int top = std::min<int>(kmax, int(round_ms.size()) - 1);
  for (int k = 0; k <= top; ++k) {
    const double t = round_ms[size_t(k)];
    if (!(t > 0)) continue;
    const double rate = expected_tokens(alpha, k) / t;
    if (rate > best_rate * (1 + 1e-9)) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

double DepthPlanner::alpha(int i) const {
  double prior = kPriorFirst;
  double a = prior;
  for (int j = 0; j <= i; ++j) {
    const double t = j < int(tried_.size()) ? tried_[size_t(j)] : 0.0, h = j < int(hit_.size()) ? hit_[size_t(j)] : 0.0;
    a = (h + kPriorWeight * prior) / (t + kPriorWeight);
    prior = a;
  }
  return a;
}

void DepthPlanner::observe(int k, int accepted, int evaluated) {
  if (tried_.size() < size_t(k)) {
    tried_.resize(size_t(k), 0.0);
    hit_.resize(size_t(k), 0.0);
  }
  for (auto& v : tried_) v *= kDecay;
  for (auto& v : hit_) v *= kDecay;
  for (int i = 0; i < evaluated && i < k; ++i) tried_[size_t(i)] += 1;
  for (int i = 0; i < accepted && i < k; ++i) hit_[size_t(i)] += 1;
}

int DepthPlanner::choose(const RoundCosts& c) {
  const int64_t r = rounds_++;
  // Nothing measured yet: a middle depth, then its neighbours.
  if (c.verify_ms(0) <= 0 && !c.measured(1)) return std::min(3, kmax_);
  std::vector<double> a(static_cast<size_t>(kmax_));
  for (int i = 0; i < kmax_; ++i) a[size_t(i)] = alpha(i);
  const auto t = c.round_ms(kmax_, mtp_);
  const int k = best_depth(t, a, kmax_);
  // exploration: a neighbour with few measurements, every fourth round; k = 1 every 16th when 0 is best
  if (r % 4 == 2) {
    for (int n : {k + 1, k - 1})
      if (n >= 1 && n <= kmax_ && c.samples(n) < 3) return n;
  }
  if (k == 0 && r % 16 == 8) return 1;
  return k;
}

}  // namespace lily
