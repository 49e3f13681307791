// Verification of one drafted token against the target model's row (speculative sampling):
//   greedy (temperature 0): the token is the row's argmax; the draft is accepted when it equals it;
//   sampled: p = the request's sampling distribution of the row (Sampler::distribution), q = the draft's
//     (one-hot when not given); accept d with probability min(1, p(d) / q(d)), otherwise draw from the
//     normalised residual max(0, p - q). The emitted token then has distribution p exactly;
//   typical (opt-in threshold t, sampled only): accept d when p(d) >= min(t, sqrt(t) · exp(-H(p))),
//     otherwise draw from p (not lossless).
// Random numbers come from the request's Sampler (same seed, same outcome).
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "runtime/sampler.h"

namespace lily {

struct Verdict {
  int32_t token = -1;  // the token emitted at this position (the draft when accepted)
  bool accepted = false;
};

// `row`: the target's logits after the request's masks; `history`: what the penalties count (the drafts
// before this position included); `q`: the draft distribution of d (empty: one-hot).
Verdict verify_draft(Sampler& s, std::span<const float> row, std::span<const int32_t> history, int32_t d,
                     std::span<const std::pair<int32_t, double>> q, float typical = 0.0f);

// The residual distribution norm(max(0, p - q)) over p's support (q empty: one-hot at d); empty when
// p <= q everywhere.
std::vector<std::pair<int32_t, double>> residual(std::span<const std::pair<int32_t, double>> p,
                                                 std::span<const std::pair<int32_t, double>> q, int32_t d);

}  // namespace lily
