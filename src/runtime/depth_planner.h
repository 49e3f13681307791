// Draft depth `auto`: the k that maximises expected tokens per second, from the measured cost of the
// loop's own rounds and the request's running acceptance per draft position.
//   E(k) = 1 + sum_{j=1..k} prod_{i<=j} a_i     (tokens a round of k drafts emits; a_i: acceptance at
//                                                position i given every earlier one was accepted)
//   T(k) = verify(k) + k · draft                 (verification step of k + 1 rows, k MTP chain steps)
// and k = argmax E(k) / T(k) over 0..kmax (0: a plain decode step). Unmeasured verification costs are
// interpolated from the measured ones (a line through them; one point: a prior slope of 15% of it per
// row, the order of a batched step's marginal row).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace lily {

// Costs measured by one generation loop (shared by its requests), exponential moving averages in ms.
class RoundCosts {
 public:
  void add_verify(int k, double ms);  // a main step holding a verification of k drafts (0: a plain decode row)
  void add_draft(double ms);          // one MTP step of a draft chain
  bool measured(int k) const { return k < int(n_.size()) && n_[size_t(k)] > 0; }
  int64_t samples(int k) const { return k < int(n_.size()) ? n_[size_t(k)] : 0; }
  double verify_ms(int k) const;      // measured, else interpolated; 0 when nothing is measured
  double draft_ms() const { return draft_; }
  // Round time T(k) for k = 0..kmax (mtp: the chain steps counted).
  std::vector<double> round_ms(int kmax, bool mtp) const;

 private:
  std::vector<double> ms_;
  std::vector<int64_t> n_;
  double draft_ = 0;
  int64_t draft_n_ = 0;
};

class DepthPlanner {
 public:
  DepthPlanner(int kmax, bool mtp) : kmax_(kmax), mtp_(mtp) {}
  // The depth for the next round (explores neighbours of the best depth while they are little measured,
  // and k = 1 now and then when speculation does not pay).
  int choose(const RoundCosts& c);
  // A round of k drafts: `accepted` accepted, `evaluated` positions verified.
  void observe(int k, int accepted, int evaluated);
  double alpha(int i) const;  // running acceptance at position i (0-based), with a prior
  int kmax() const { return kmax_; }

  static double expected_tokens(std::span<const double> alpha, int k);
  // argmax_k E(k) / round_ms[k] over k = 0..min(kmax, round_ms.size() - 1); alpha[i] for position i
  // (the last value repeats past the end).
  static int best_depth(std::span<const double> round_ms, std::span<const double> alpha, int kmax);

 private:
  int kmax_;
  bool mtp_;
  int64_t rounds_ = 0;
  std::vector<double> tried_, hit_;  // decayed counts per position
};

}  // namespace lily
