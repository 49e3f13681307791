// Test support: a drafter that replays a given continuation (e.g. the plain greedy output) with a scripted
// number of correct tokens per round, so that every accept count 0..k is exercised: round r drafts k
// tokens whose first schedule[r % size] are the continuation's next tokens and the rest are not.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/drafter.h"

namespace lily::test_support {

class ReplayDrafter final : public Drafter {
 public:
  // `prompt_len`: tokens of the sequence before the continuation; `vocab`: for the wrong tokens.
  ReplayDrafter(size_t prompt_len, std::vector<int32_t> continuation, std::vector<int> schedule, int64_t vocab)
      : prompt_len_(prompt_len), truth_(std::move(continuation)), schedule_(std::move(schedule)), vocab_(vocab) {}
  std::string name() const override { return "replay"; }
  void begin(const DraftRequest& r) override {
    const size_t g = r.tokens.size() - prompt_len_;  // tokens emitted so far: truth_[g] comes next
    const int good = schedule_.empty() ? r.k : schedule_[rounds_ % schedule_.size()];
    ++rounds_;
    d_ = {};
    for (int i = 0; i < r.k; ++i) {
      const size_t at = g + size_t(i);
      const int32_t t = at < truth_.size() ? truth_[at] : 0;
      d_.tokens.push_back(i < good && at < truth_.size() ? t : int32_t((t + 1 + i) % vocab_));
    }
  }
  Draft draft(SequenceState&) override { return std::move(d_); }
  void verified(int drafted, int accepted) override { outcomes.push_back({drafted, accepted}); }

  std::vector<std::pair<int, int>> outcomes;  // (drafted, accepted) per round

 private:
  size_t prompt_len_;
  std::vector<int32_t> truth_;
  std::vector<int> schedule_;
  int64_t vocab_;
  size_t rounds_ = 0;
  Draft d_;
};

}  // namespace lily::test_support
