#include <algorithm>
#include <set>

#include "backend/backend.h"

namespace lily {

size_t Step::add(SequenceState& seq, std::span<const int32_t> toks, int32_t out_rows, bool logits, bool sample,
                 bool tentative) {
  StepGroup g;
  g.seq = &seq;
  g.first = int32_t(tokens.size());
  g.rows = int32_t(toks.size());
  g.out_rows = out_rows;
  g.logits = logits;
  g.sample = sample;
  g.tentative = tentative;
  tokens.insert(tokens.end(), toks.begin(), toks.end());
  groups.push_back(g);
  return groups.size() - 1;
}

size_t Step::add_mtp(SequenceState& seq, std::span<const int32_t> toks, std::span<const int32_t> hid, int32_t out_rows,
                     bool logits, bool sample) {
  LILY_ASSERT(hid.size() == toks.size());
  mtp = true;
  hidden.resize(tokens.size());  // rows added before (none in a well-formed MTP step)
  hidden.insert(hidden.end(), hid.begin(), hid.end());
  return add(seq, toks, out_rows, logits, sample, false);
}

int64_t Step::logit_rows() const {
  int64_t n = 0;
  for (const StepGroup& g : groups)
    if (g.logits) n += g.out_rows;
  return n;
}

int64_t Step::sample_rows() const {
  int64_t n = 0;
  for (const StepGroup& g : groups)
    if (g.sample) n += g.out_rows;
  return n;
}

void Step::validate(int64_t vocab) const {
  if (groups.empty()) throw InternalError("step: no groups");
  std::set<const SequenceState*> seen;
  int64_t next = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const StepGroup& g = groups[i];
    auto bad = [&](const std::string& why) {
      throw InternalError("step group " + std::to_string(i) + ": " + why);
    };
    if (!g.seq) bad("no sequence");
    if (!seen.insert(g.seq).second) bad("its sequence appears in an earlier group of the step");
    if (g.first != next || g.rows <= 0 || int64_t(g.first) + g.rows > int64_t(tokens.size()))
      bad("rows [" + std::to_string(g.first) + ", " + std::to_string(g.first + g.rows) + ") do not follow the previous group within " +
          std::to_string(tokens.size()) + " tokens");
    next = g.first + g.rows;
    if (g.seq->pending() > 0) bad("its sequence has " + std::to_string(g.seq->pending()) + " tentative rows awaiting commit()");
    const int64_t at = mtp ? g.seq->mtp_tokens() : g.seq->n_tokens();
    if (at + g.rows > g.seq->capacity())
      bad(std::to_string(g.rows) + (mtp ? " MTP rows after " : " rows after ") + std::to_string(at) +
          " tokens exceed the capacity " + std::to_string(g.seq->capacity()));
    if (mtp) {
      if (g.tentative || g.keep_hidden) bad("an MTP group cannot be tentative or keep hidden rows");
      for (int32_t r = g.first; r < g.first + g.rows; ++r) {
        const int32_t h = hidden[size_t(r)];
        if (h == kMtpHidden && r != g.first) bad("an MTP row reads the previous MTP step's h' (kMtpHidden) but is not the group's first row");
        if (h != kMtpHidden && (h < 0 || h >= g.seq->hidden_rows()))
          bad("MTP row " + std::to_string(r) + " reads hidden row " + std::to_string(h) + " but the sequence's latest main step kept " +
              std::to_string(g.seq->hidden_rows()));
      }
    }
    if (g.out_rows < 0 || g.out_rows > g.rows) bad("out_rows " + std::to_string(g.out_rows) + " outside 0.." + std::to_string(g.rows));
    if (g.out_rows > 0 && !g.logits && !g.sample) bad("outputs asked for without logits or sampling");
    if (g.tentative && g.rows > g.seq->max_tentative())
      bad("tentative step of " + std::to_string(g.rows) + " rows, but the sequence reserved checkpoints for " +
          std::to_string(g.seq->max_tentative()));
    for (int32_t r = g.first; r < g.first + g.rows; ++r) {
      const int32_t t = tokens[size_t(r)];
      if (t == kFedToken) {
        if (r != g.first) bad("a fed row (kFedToken) that is not the group's first row");
        continue;
      }
      if (t < 0 || t >= vocab) bad("token id " + std::to_string(t) + " outside [0, " + std::to_string(vocab) + ")");
    }
  }
  if (next != int64_t(tokens.size())) throw InternalError("step: tokens past the last group");
  if (mtp && hidden.size() != tokens.size())
    throw InternalError("MTP step: " + std::to_string(hidden.size()) + " hidden inputs for " + std::to_string(tokens.size()) + " rows");
  if (!mtp && !hidden.empty()) throw InternalError("step: hidden inputs given for a main step");
  if (head_vocab < 0 || head_vocab > vocab || (!mtp && head_vocab != 0))
    throw InternalError("step: head_vocab " + std::to_string(head_vocab) + (mtp ? " outside 0.." + std::to_string(vocab) : " set on a main step"));
}

}  // namespace lily
