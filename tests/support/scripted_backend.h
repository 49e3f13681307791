// Test support: the CPU backend with its logits following a script, so that server tests over HTTP see
// chosen model output (think blocks, tool calls inside them, several calls) from a random model. A logits
// row after a sequence whose last k tokens are the script's first k (the longest such k) puts the
// script's token k far above every other, and the end id after the whole script: whatever the prompt,
// the reply is the script (its first token must not end the prompt). MTP steps keep the model's logits.
// Each sequence's tokens are tracked by position from the steps (a state restored from the prompt cache
// has unknown tokens before its rows: serve with the cache off).
#pragma once
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cpu_wrapper.h"
#include "core/error.h"

namespace lily::test_support {

class ScriptedCpuBackend final : public CpuWrapper {
 public:
  ScriptedCpuBackend(std::shared_ptr<const ModelWeights> w, int32_t end_id) : CpuWrapper(std::move(w)), end_(end_id) {}

  // The reply of every request from now on (empty: the model's own logits).
  void set_script(std::vector<int32_t> s) {
    std::lock_guard lk(mu_);
    script_ = std::move(s);
  }

  std::string name() const override { return "cpu+script"; }
  void begin(const Step& step) override {
    std::vector<int32_t> script;
    {
      std::lock_guard lk(mu_);
      script = script_;
    }
    Out o;
    for (const StepGroup& g : step.groups) {
      std::vector<int32_t>& seen = seen_[g.seq];
      seen.resize(size_t(g.seq->n_tokens()), -1);  // rows past the committed ones were discarded (tentative)
      for (int32_t r = 0; r < g.rows; ++r) {
        if (!step.mtp) seen.push_back(step.tokens[size_t(g.first + r)]);
        if (!g.logits || r < g.rows - g.out_rows) continue;
        o.next.push_back(step.mtp || script.empty() ? -1 : next_of(script, seen));
      }
    }
    pending_.push_back(std::move(o));
    cpu_.begin(step);
  }
  uint64_t end() override {
    const uint64_t t = cpu_.end();
    pending_.back().ticket = t;
    done_.push_back(std::move(pending_.back()));
    pending_.pop_back();
    return t;
  }
  void finish(uint64_t ticket, const StepOutputs& out) override {
    cpu_.finish(ticket, out);
    LILY_ASSERT(!done_.empty() && done_.front().ticket == ticket);
    const size_t V = size_t(weights().cfg.vocab);
    for (size_t i = 0; out.logits && i < done_.front().next.size(); ++i) {
      const int32_t t = done_.front().next[i];
      if (t < 0) continue;
      float* row = out.logits + i * V;
      std::fill(row, row + V, 0.0f);
      row[size_t(t)] = 60.0f;
    }
    done_.pop_front();
  }

 private:
  // The script's token after `seen`, or the end id once all of it is there.
  int32_t next_of(const std::vector<int32_t>& script, std::span<const int32_t> seen) const {
    for (size_t k = std::min(script.size(), seen.size());; --k)
      if (std::equal(script.begin(), script.begin() + std::ptrdiff_t(k), seen.end() - std::ptrdiff_t(k)))
        return k == script.size() ? end_ : script[k];  // k == 0 always matches
  }

  struct Out {
    uint64_t ticket = 0;
    std::vector<int32_t> next;  // per logits row: the scripted token, or -1
  };
  int32_t end_;
  std::mutex mu_;
  std::vector<int32_t> script_;
  std::map<const SequenceState*, std::vector<int32_t>> seen_;
  std::deque<Out> pending_, done_;
};

}  // namespace lily::test_support
