#include "runtime/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace lily {

namespace {

// x = n·ln2 + r with |r| <= ln2/2 (Cody-Waite: n·kLn2Hi is exact for |n| < 2^21), exp(r) by its Taylor
// series to degree 13 (truncation < 5e-18), 2^n added to the exponent field. Results below 2^-1021
// would need a subnormal: 0 instead (x < -708).
inline double exp_nonpos_inline(double x) {
  constexpr double kShift = 0x1.8p52;
  constexpr double kLog2e = 0x1.71547652b82fep0;
  constexpr double kLn2Hi = 0x1.62e42feep-1, kLn2Lo = 0x1.a39ef35793c76p-33;
  const double t = x * kLog2e + kShift;
  const double n = t - kShift;
  const double r = (x - n * kLn2Hi) - n * kLn2Lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const uint64_t bits = std::bit_cast<uint64_t>(p) + (std::bit_cast<uint64_t>(t) << 52);
  return x < -708.0 ? 0.0 : std::bit_cast<double>(bits);
}

// Draw order: logit descending, id ascending.
struct Before {
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return a.l > b.l || (a.l == b.l && a.id < b.id);
  }
};

// The first position of `v` (in draw order) where cum + the prefix mass reaches `target` (>= target;
// strict: > target); v.size() when the whole of v does not. `cum` is advanced past the elements before
// the position. v is reordered: [0, pos) holds the elements before it (in any order) and the window
// around pos is sorted. Large v is bisected with nth_element (linear on average), not sorted.
// Greedy: the highest logit, the lowest id on ties.
int32_t greedy(std::span<const float> l) {
  size_t best = 0;
  for (size_t i = 1; i < l.size(); ++i)
    if (l[i] > l[best]) best = i;
  return int32_t(best);
}

template <typename C>
size_t locate(std::vector<C>& v, double& cum, double target, bool strict) {
  auto reached = [&](double c) { return strict ? c > target : c >= target; };
  size_t lo = 0, hi = v.size();
  while (hi - lo > 256) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(v.begin() + ptrdiff_t(lo), v.begin() + ptrdiff_t(mid), v.begin() + ptrdiff_t(hi), Before{});
    double m = 0;
    for (size_t i = lo; i < mid; ++i) m += v[i].e;
    if (reached(cum + m)) {
      hi = mid;
    } else {
      cum += m;
      lo = mid;
    }
  }
  std::sort(v.begin() + ptrdiff_t(lo), v.begin() + ptrdiff_t(hi), Before{});
  for (size_t i = lo; i < hi; ++i) {
    if (reached(cum + v[i].e)) return i;
    cum += v[i].e;
  }
  // Not reached within [lo, hi): with bisection this only happens through rounding; the rest of v
  // (after hi) is then scanned in order.
  if (hi < v.size()) {
    std::sort(v.begin() + ptrdiff_t(hi), v.end(), Before{});
    for (size_t i = hi; i < v.size(); ++i) {
      if (reached(cum + v[i].e)) return i;
      cum += v[i].e;
    }
  }
  return v.size();
}

}  // namespace

double detail::exp_nonpos(double x) { return exp_nonpos_inline(x); }

inline double Sampler::Binning::mass(float l) const { return exp_nonpos_inline(double(l - mx) * inv_t); }

inline uint16_t Sampler::Binning::bin(float l) const {
  constexpr float kLast = float(kBins - 1);
  const float k = l - mx;
  const float f = -k * scale;
  const float fb = f < kLast ? f : kLast;  // NaN (-inf · 0), +inf and beyond the range -> the last bin
  return double(k) * inv_t >= log_min_p ? uint16_t(fb) : uint16_t(kBins);
}

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

Sampler::Sampler(const SamplingParams& p) : Sampler(p, kDefaultSortLimit) {}

Sampler::Sampler(const SamplingParams& p, size_t sort_limit) : p_(p), sort_limit_(sort_limit) {
  validate(p);
  rng_.seed(p.seed ? *p.seed : std::random_device{}());
}

std::span<const float> Sampler::penalised(std::span<const float> logits, std::span<const int32_t> history) {
  if (history.empty() || (p_.repetition_penalty == 1.0f && p_.presence_penalty == 0.0f && p_.frequency_penalty == 0.0f))
    return logits;
  const int64_t V = int64_t(logits.size());
  work_.assign(logits.begin(), logits.end());
  if (counts_.size() < logits.size()) counts_.resize(logits.size(), 0);
  for (int32_t t : history)
    if (t >= 0 && t < V) ++counts_[size_t(t)];
  for (int32_t t : history) {
    if (t < 0 || t >= V || counts_[size_t(t)] == 0) continue;
    const int c = counts_[size_t(t)];
    counts_[size_t(t)] = 0;  // each id once; the counts are zero again afterwards
    float& l = work_[size_t(t)];
    if (p_.repetition_penalty != 1.0f) l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    l -= p_.presence_penalty + p_.frequency_penalty * float(c);
  }
  return work_;
}

void Sampler::select(std::span<const float> logits, bool want_sorted) {
  const size_t V = logits.size();
  // Pass 1: the maximum, the smallest finite logit, and no NaN or +inf (16 lanes so it vectorises).
  constexpr int L = 16;
  float mx_l[L], mn_l[L];
  int bad_l[L];
  for (int j = 0; j < L; ++j) mx_l[j] = -INFINITY, mn_l[j] = INFINITY, bad_l[j] = 0;
  size_t i = 0;
  for (; i + L <= V; i += L)
    for (int j = 0; j < L; ++j) {
      const float x = logits[i + size_t(j)];
      mx_l[j] = x > mx_l[j] ? x : mx_l[j];
      mn_l[j] = (x < mn_l[j] && x != -INFINITY) ? x : mn_l[j];
      bad_l[j] |= (x != x) | (x == INFINITY);
    }
  for (; i < V; ++i) {
    const float x = logits[i];
    mx_l[0] = x > mx_l[0] ? x : mx_l[0];
    mn_l[0] = (x < mn_l[0] && x != -INFINITY) ? x : mn_l[0];
    bad_l[0] |= (x != x) | (x == INFINITY);
  }
  float mx = -INFINITY, mn = INFINITY;
  int bad = 0;
  for (int j = 0; j < L; ++j) mx = std::max(mx, mx_l[j]), mn = std::min(mn, mn_l[j]), bad |= bad_l[j];
  if (bad) throw InternalError("sampler: the logits hold NaN or +inf");
  if (mx == -INFINITY) throw InternalError("sampler: every logit is -inf (no token can be drawn)");

  // Candidates: the vocabulary, or the top-k subset (unordered).
  sel_l_ = logits;
  sel_id_ = nullptr;
  if (p_.top_k > 0 && size_t(p_.top_k) < V) {
    const size_t k = size_t(p_.top_k);
    scratch_.clear();
    if (k * 16 <= V) {
      // Heap of the k best so far, the worst on top; a later id with an equal logit is worse.
      for (size_t t = 0; t < k; ++t) scratch_.push_back({logits[t], int32_t(t), 0.0});
      std::make_heap(scratch_.begin(), scratch_.end(), Before{});
      for (size_t t = k; t < V; ++t)
        if (logits[t] > scratch_.front().l) {
          std::pop_heap(scratch_.begin(), scratch_.end(), Before{});
          scratch_.back() = {logits[t], int32_t(t), 0.0};
          std::push_heap(scratch_.begin(), scratch_.end(), Before{});
        }
    } else {
      for (size_t t = 0; t < V; ++t) scratch_.push_back({logits[t], int32_t(t), 0.0});
      std::nth_element(scratch_.begin(), scratch_.begin() + ptrdiff_t(k - 1), scratch_.end(), Before{});
      scratch_.resize(k);
    }
    sub_l_.resize(k);
    sub_id_.resize(k);
    mn = INFINITY;
    for (size_t t = 0; t < k; ++t) {
      sub_l_[t] = scratch_[t].l;
      sub_id_[t] = scratch_[t].id;
      if (scratch_[t].l != -INFINITY) mn = std::min(mn, scratch_[t].l);
    }
    sel_l_ = sub_l_;
    sel_id_ = sub_id_.data();
  }
  const size_t n = sel_l_.size();

  // Bins: logits binned linearly from the maximum (bin 0) to the smallest finite one (bin kBins - 1),
  // so bins are in draw order; -inf goes to the last bin; kBins marks a candidate that min-p cuts
  // (e < min_p, as p < p_max · min_p with p_max = 1 / Z). Below (l - max) / T = -709 every e is 0:
  // those share the last bin, and the bins cover the rest.
  const float range = std::min(mx - mn, float(709.0 * double(p_.temperature)));
  bins_ = {mx, range > 0 ? float(kBins - 1) / range : 0.0f, 1.0 / double(p_.temperature),
           p_.min_p > 0.0f ? std::log(double(p_.min_p)) : -INFINITY};
  const Binning bins = bins_;

  // Pass 2, in chunks that stay in L1: e and the bin of each candidate (vectorised), then the mass and
  // count per bin. Eight interleaved histograms: ids often share a bin (ties, the min-p bin), and one
  // histogram would chain every update through the same store-to-load round trip. Z is the sum of
  // every bin, the min-p bin included.
  constexpr size_t H = 8, W = kBins + 1, kChunk = 1024;
  bin_mass_.assign(H * W, 0.0);
  bin_count_.assign(H * W, 0);
  double* bm = bin_mass_.data();
  uint32_t* bc = bin_count_.data();
  const float* sl = sel_l_.data();
  alignas(64) double ec[kChunk];
  alignas(64) uint16_t bq[kChunk];
  for (size_t c0 = 0; c0 < n; c0 += kChunk) {
    const size_t m = std::min(kChunk, n - c0);
    for (size_t t = 0; t < m; ++t) {
      const float l = sl[c0 + t];
      ec[t] = bins.mass(l);
      bq[t] = bins.bin(l);
    }
    size_t t = 0;
    for (; t + H <= m; t += H)
      for (size_t j = 0; j < H; ++j) {
        bm[j * W + bq[t + j]] += ec[t + j];
        ++bc[j * W + bq[t + j]];
      }
    for (; t < m; ++t) {
      bm[bq[t]] += ec[t];
      ++bc[bq[t]];
    }
  }
  z_ = 0;
  for (size_t b = 0; b < W; ++b) {
    for (size_t j = 1; j < H; ++j) bm[b] += bm[j * W + b], bc[b] += bc[j * W + b];
    z_ += bm[b];
  }

  // Top-p: the first bin where the cumulative mass reaches top_p · Z holds the cut; only it is ordered.
  cut_bin_ = -1;
  kept_ = 0;
  kept_mass_ = 0;
  const double target = double(p_.top_p) * z_;
  for (int b = 0; b < kBins; ++b) {
    const uint32_t c = bin_count_[size_t(b)];
    if (c == 0) continue;
    if (p_.top_p < 1.0f && kept_mass_ + bin_mass_[size_t(b)] >= target) {
      // Few enough ids up to this bin: order them all at once (they are the kept set's superset);
      // otherwise only this bin.
      const bool whole = kept_ + c <= sort_limit_;
      double cum = whole ? 0.0 : kept_mass_;
      gather(whole ? 0 : b, b, scratch_);
      const size_t pos = locate(scratch_, cum, target, false);
      if (pos < scratch_.size()) {
        cut_bin_ = b;
        cut_pos_ = pos;
        cut_whole_ = whole;
        cut_id_ = scratch_[pos].id;
        kept_ = (whole ? 0 : kept_) + pos + 1;
        kept_mass_ = cum + scratch_[pos].e;
        break;
      }
      kept_mass_ = cum;  // rounding: the whole bin stays below the target, the cut lies further on
      kept_ += c;
      continue;
    }
    kept_mass_ += bin_mass_[size_t(b)];
    kept_ += c;
  }
  sorted_ = false;
  if (want_sorted || kept_ <= sort_limit_) materialise();
}

void Sampler::gather(int lo, int hi, std::vector<Cand>& out) const {
  out.clear();
  const size_t n = sel_l_.size();
  const float* sl = sel_l_.data();
  const Binning bins = bins_;
  const uint16_t base = uint16_t(lo), span = uint16_t(hi - lo);
  auto hit = [&](size_t i) { return uint16_t(bins.bin(sl[i]) - base) <= span; };
  // Blocks of 16 without a hit are skipped by a vectorised test (the wanted bins are usually sparse).
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    int any = 0;
    for (size_t j = 0; j < 16; ++j) any |= uint16_t(bins.bin(sl[i + j]) - base) <= span;
    if (!any) continue;
    for (size_t j = i; j < i + 16; ++j)
      if (hit(j)) out.push_back({sl[j], id_of(j), bins.mass(sl[j])});
  }
  for (; i < n; ++i)
    if (hit(i)) out.push_back({sl[i], id_of(i), bins.mass(sl[i])});
}

void Sampler::materialise() {
  if (cut_bin_ >= 0 && cut_whole_) {
    kept_sorted_.assign(scratch_.begin(), scratch_.begin() + ptrdiff_t(cut_pos_ + 1));
  } else {
    // Whole bins before the cut, then the cut bin's kept part.
    const int below = cut_bin_ >= 0 ? cut_bin_ : kBins;
    kept_sorted_.clear();
    if (below > 0) gather(0, below - 1, kept_sorted_);
    if (cut_bin_ >= 0) kept_sorted_.insert(kept_sorted_.end(), scratch_.begin(), scratch_.begin() + ptrdiff_t(cut_pos_ + 1));
  }
  std::sort(kept_sorted_.begin(), kept_sorted_.end(), Before{});
  LILY_ASSERT(kept_sorted_.size() == kept_);
  sorted_ = true;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const std::span<const float> l = penalised(logits, history);
  LILY_ASSERT(!l.empty());
  if (p_.temperature == 0.0f) return greedy(l);
  select(l, false);
  if (sorted_) {
    double total = 0;
    for (auto& c : kept_sorted_) total += c.e / z_;
    std::uniform_real_distribution<double> U(0.0, total);
    double r = U(rng_), acc = 0;
    for (auto& c : kept_sorted_) {
      acc += c.e / z_;
      if (r < acc) return c.id;
    }
    return kept_sorted_.back().id;
  }
  // A large kept set: the draw falls in one bin; only that bin is ordered.
  std::uniform_real_distribution<double> U(0.0, kept_mass_ / z_);
  const double R = U(rng_) * z_;
  const int last = cut_bin_ >= 0 ? cut_bin_ : kBins - 1;
  double cum = 0;
  int last_positive = -1;
  for (int b = 0; b <= last; ++b) {
    if (bin_count_[size_t(b)] == 0) continue;
    if (bin_mass_[size_t(b)] > 0) last_positive = b;
    if (cum + bin_mass_[size_t(b)] <= R) {
      cum += bin_mass_[size_t(b)];
      continue;
    }
    if (b == cut_bin_) {
      // Only the kept part of the cut bin (scratch_[0, cut_pos_]) may be drawn.
      draw_.assign(scratch_.begin(), scratch_.begin() + ptrdiff_t(cut_pos_ + 1));
    } else {
      gather(b, b, draw_);
    }
    const size_t pos = locate(draw_, cum, R, true);
    if (pos < draw_.size()) return draw_[pos].id;
  }
  // R at or past the kept mass through rounding: the last kept id with positive probability.
  if (cut_bin_ >= 0) return cut_id_;
  LILY_ASSERT(last_positive >= 0);
  gather(last_positive, last_positive, draw_);
  std::sort(draw_.begin(), draw_.end(), Before{});
  size_t j = draw_.size();
  while (j > 1 && draw_[j - 1].e == 0) --j;
  return draw_[j - 1].id;
}

std::vector<std::pair<int32_t, double>> Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history) {
  const std::span<const float> l = penalised(logits, history);
  LILY_ASSERT(!l.empty());
  if (p_.temperature == 0.0f) return {{greedy(l), 1.0}};
  select(l, true);
  double total = 0;
  for (auto& c : kept_sorted_) total += c.e / z_;
  std::vector<std::pair<int32_t, double>> out(kept_sorted_.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = {kept_sorted_[i].id, kept_sorted_[i].e / z_ / total};
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
