// MTP drafts (model doc §5): the model's own multi-token-prediction head, fed the main model's post-norm
// states. Pair t = (x_{t+1}, h_t) sits at the next MTP position; the catch-up rows absorb the pairs of
// every main step's kept rows whose next token is known, the last of them in a round being (x_n, h_{n-1})
// with x_n the token the verification absorbs first: its logits give d1. Chain rows (d_j, h'_j) give the
// deeper drafts; they are not pairs of the sequence and are truncated from the MTP cache afterwards.
// A sequence whose MTP cache lags its kept rows (a prompt-cache snapshot taken without MTP) continues at
// the next MTP position: only the drafts, never the output, depend on it.
#include <algorithm>
#include <optional>

#include "core/error.h"
#include "runtime/drafter.h"

namespace lily {

namespace {

class MtpDrafter final : public Drafter {
 public:
  MtpDrafter(const ModelWeights& w, const SpecParams& p, uint64_t seed)
      : vocab_(w.cfg.vocab), lookup_max_(std::max(p.lookup_max, p.fallback_match)),
        fallback_(p.fallback_match), seed_(seed) {
    w.require_mtp();
  }
  std::string name() const override { return "mtp"; }
  bool uses_mtp() const override { return true; }

  void kept(int64_t pos0, int64_t rows) override {
    kept0_ = pos0;
    kept_n_ = rows;
    if (next_pair_ < pos0) next_pair_ = pos0;  // pairs whose states were not kept are skipped
  }

  bool mtp_rows(std::span<const int32_t> tokens, const SequenceState& st, MtpRows& rows) override {
    if (chain_) {  // (d_j, h'_j)
      chain_ = false;
      awaiting_ = true;
      rows.tokens = {draft_.tokens.back()};
      rows.hidden = {kMtpHidden};
      rows.logits = true;
      rows.argmax = !sampler_;
      return true;
    }
    const int64_t t0 = std::max(next_pair_, kept0_), t1 = std::min(kept0_ + kept_n_, int64_t(tokens.size()) - 1);
    if (t0 >= t1) return false;
    rows.tokens.assign(tokens.begin() + t0 + 1, tokens.begin() + t1 + 1);
    rows.hidden.clear();
    for (int64_t t = t0; t < t1; ++t) rows.hidden.push_back(int32_t(t - kept0_));
    next_pair_ = t1;
    real_ = st.mtp_tokens() + (t1 - t0);
    // the round's first draft row: the pair of the last verified token
    rows.logits = round_ && first_ && t1 == int64_t(tokens.size()) - 1;
    rows.argmax = rows.logits && !sampler_;
    if (rows.logits) {
      first_ = false;
      awaiting_ = true;
    }
    return true;
  }

  void mtp_logits(std::span<const float> logits) override {
    LILY_ASSERT(awaiting_ && int64_t(logits.size()) == vocab_);
    if (sampler_) {
      auto q = sampler_->distribution(logits);
      const int32_t d = sampler_->draw(q);
      draft_.q.push_back(std::move(q));
      take(d);
    } else {
      take(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));  // lowest id on ties
    }
  }
  void mtp_id(int32_t id) override {
    LILY_ASSERT(awaiting_ && !sampler_ && id >= 0 && id < vocab_);
    take(id);
  }

  void begin(const DraftRequest& r) override {
    round_ = true;
    first_ = true;
    chain_ = awaiting_ = false;
    k_ = r.k;
    draft_ = {};
    if (r.sample && !sampler_) {
      SamplingParams sp = *r.sample;  // q: the request's filters and temperature, no penalties
      sp.repetition_penalty = 1.0f;
      sp.presence_penalty = sp.frequency_penalty = 0.0f;
      sp.seed = seed_;
      sampler_.emplace(sp);
    }
    if (!r.sample) sampler_.reset();
    if (fallback_ > 0) {
      Lookup lk = prompt_lookup(r.tokens, fallback_, lookup_max_, r.k);
      if (lk.match >= fallback_) {
        draft_.tokens = std::move(lk.tokens);
        first_ = false;  // catch-up only
      }
    }
  }

  Draft draft(SequenceState& st) override {
    if (st.mtp_tokens() > real_) st.truncate_mtp(real_);
    round_ = first_ = chain_ = awaiting_ = false;
    return std::move(draft_);
  }

 private:
  void take(int32_t d) {
    awaiting_ = false;
    draft_.tokens.push_back(d);
    chain_ = int(draft_.tokens.size()) < k_;
  }

  int64_t vocab_;
  int lookup_max_, fallback_;
  uint64_t seed_;
  int64_t kept0_ = 0, kept_n_ = 0;  // the kept rows: positions [kept0_, kept0_ + kept_n_)
  int64_t next_pair_ = 0;           // the next pair t to absorb
  int64_t real_ = 0;                // MTP rows that are pairs of the sequence
  bool round_ = false, first_ = false, chain_ = false, awaiting_ = false;
  int k_ = 0;
  Draft draft_;
  std::optional<Sampler> sampler_;
};

}  // namespace

std::shared_ptr<Drafter> make_mtp_drafter(const ModelWeights& w, const SpecParams& p, uint64_t seed) {
  return std::make_shared<MtpDrafter>(w, p, seed);
}

}  // namespace lily
