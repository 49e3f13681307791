// Prompt lookup (n-gram) drafts: no model, strong where the output repeats the prompt or itself (code
// edits, quoting, lists).
#include <algorithm>

#include "core/error.h"
#include "runtime/drafter.h"

namespace lily {

Lookup prompt_lookup(std::span<const int32_t> t, int nmin, int nmax, int k) {
  Lookup out;
  const int64_t L = int64_t(t.size());
  if (L < 2 || k < 1 || nmin < 1) return out;
  // Candidates end where the last token occurred before; the match grows backwards from there. Scanning
  // from the most recent, only a strictly longer match replaces the best.
  int64_t best_j = -1;
  int best = 0;
  const int32_t last = t[size_t(L - 1)];
  for (int64_t j = L - 2; j >= 0 && best < nmax; --j) {
    if (t[size_t(j)] != last) continue;
    int len = 1;
    while (len < nmax && j - len >= 0 && t[size_t(j - len)] == t[size_t(L - 1 - len)]) ++len;
    if (len > best) {
      best = len;
      best_j = j;
    }
  }
  if (best < nmin) return out;
  out.match = best;
  const int64_t from = best_j + 1, to = std::min<int64_t>(from + k, L);
  out.tokens.assign(t.begin() + from, t.begin() + to);
  return out;
}

namespace {

class LookupDrafter final : public Drafter {
 public:
  LookupDrafter(int nmin, int nmax) : nmin_(nmin), nmax_(nmax) {}
  std::string name() const override { return "ngram"; }
  void begin(const DraftRequest& r) override { d_.tokens = prompt_lookup(r.tokens, nmin_, nmax_, r.k).tokens; }
  Draft draft(SequenceState&) override { return std::move(d_); }

 private:
  int nmin_, nmax_;
  Draft d_;
};

}  // namespace

std::shared_ptr<Drafter> make_lookup_drafter(int nmin, int nmax) { return std::make_shared<LookupDrafter>(nmin, nmax); }

std::shared_ptr<Drafter> make_drafter(const SpecParams& p, const ModelWeights& w, uint64_t seed) {
  if (p.drafter) return p.drafter;
  validate(p);
  switch (p.mode) {
    case SpecMode::Mtp: return make_mtp_drafter(w, p, seed);
    case SpecMode::Ngram: return make_lookup_drafter(p.lookup_min, p.lookup_max);
    case SpecMode::Off: break;
  }
  return nullptr;
}

}  // namespace lily
