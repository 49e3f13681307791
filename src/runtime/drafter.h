// Drafters: what proposes the tokens a speculative round verifies (runtime/spec.h). One drafter per
// request. The generation loop drives it:
//   begin(request)                      a round starts: draft up to k tokens after the sequence
//   mtp_rows() / mtp_logits()           MTP drafters: the rows of this sequence in the loop's next MTP
//                                       step (every MTP drafter's rows share one step) and the logits of
//                                       its last row (or mtp_id(): their argmax, drawn by the backend),
//                                       until mtp_rows() gives none
//   draft(state)                        the round's draft (its chain rows dropped from the MTP cache)
//   verified(drafted, accepted)         the verification's outcome
// MTP drafters see kept(pos0, rows) after each main step of their sequence (which keeps its hidden rows)
// and catch the MTP cache up through mtp_rows() before the sequence's next main step, inside rounds or
// not. Drafts may be shorter than k or empty (the round is then a plain decode step).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "runtime/sampler.h"
#include "runtime/spec.h"

namespace lily {

// d1..dk and, when they were drawn from distributions, q_i per token (kept ids with their probabilities,
// Sampler::distribution); q empty: every draft is one-hot (greedy, prompt lookup, replay).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<std::pair<int32_t, double>>> q;
};

struct DraftRequest {
  std::span<const int32_t> tokens;  // the sequence so far; its last token is the next the model absorbs
  int k = 1;                        // most tokens to draft (>= 1)
  // Draw drafts from the drafter's distribution with these parameters (q returned); null: greedy drafts.
  const SamplingParams* sample = nullptr;
};

// Rows a drafter adds to an MTP step for its sequence (Step::add_mtp).
struct MtpRows {
  std::vector<int32_t> tokens, hidden;
  bool logits = false;  // the last row's logits come back through mtp_logits()
  // With logits: their argmax suffices (a greedy draft); a backend that draws on the device then hands it
  // to mtp_id() instead, and the logits stay on the device.
  bool argmax = false;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  virtual bool uses_mtp() const { return false; }
  virtual void kept(int64_t /*pos0*/, int64_t /*rows*/) {}
  // `tokens`: the sequence's known tokens (as in DraftRequest); `st`: its state (mtp_tokens()).
  virtual bool mtp_rows(std::span<const int32_t> /*tokens*/, const SequenceState& /*st*/, MtpRows& /*rows*/) { return false; }
  virtual void mtp_logits(std::span<const float> /*logits*/) {}
  virtual void mtp_id(int32_t /*id*/) {}
  virtual void begin(const DraftRequest& r) = 0;
  virtual Draft draft(SequenceState& st) = 0;
  virtual void verified(int /*drafted*/, int /*accepted*/) {}
};

// A drafter that hands every call to another (decorators: the bench's oracle, tests' recorders) and
// overrides what it changes.
class DrafterWrapper : public Drafter {
 public:
  explicit DrafterWrapper(std::shared_ptr<Drafter> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  bool uses_mtp() const override { return inner_->uses_mtp(); }
  void kept(int64_t pos0, int64_t rows) override { inner_->kept(pos0, rows); }
  bool mtp_rows(std::span<const int32_t> tokens, const SequenceState& st, MtpRows& rows) override {
    return inner_->mtp_rows(tokens, st, rows);
  }
  void mtp_logits(std::span<const float> logits) override { inner_->mtp_logits(logits); }
  void mtp_id(int32_t id) override { inner_->mtp_id(id); }
  void begin(const DraftRequest& r) override { inner_->begin(r); }
  Draft draft(SequenceState& st) override { return inner_->draft(st); }
  void verified(int drafted, int accepted) override { inner_->verified(drafted, accepted); }

 protected:
  std::shared_ptr<Drafter> inner_;
};

// The drafter of p.mode (p.drafter when given). MTP needs the model's MTP block: throws InputError
// naming the missing tensors. `seed`: for drafts drawn from q.
std::shared_ptr<Drafter> make_drafter(const SpecParams& p, const ModelWeights& w, uint64_t seed);

// Prompt lookup over `tokens`: the longest suffix of nmin..nmax tokens that also occurs earlier (most
// recent occurrence) and up to k tokens that followed it there.
struct Lookup {
  int match = 0;  // suffix length matched (0: none)
  std::vector<int32_t> tokens;
};
Lookup prompt_lookup(std::span<const int32_t> tokens, int nmin, int nmax, int k);

// The drafters (drafter_ngram.cpp, drafter_mtp.cpp).
std::shared_ptr<Drafter> make_lookup_drafter(int nmin, int nmax);
std::shared_ptr<Drafter> make_mtp_drafter(const ModelWeights& w, const SpecParams& p, uint64_t seed);

}  // namespace lily
