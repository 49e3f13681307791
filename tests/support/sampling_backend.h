// Test support: the CPU backend with an emulated device sampler (Backend::can_sample): groups that ask for
// drawn ids are drawn here by the host Sampler with the sequence's DeviceSampling, fed rows (kFedToken)
// read the sequence's last drawn id, MTP groups that ask for ids get each row's argmax. Lets the runtime's
// device-sampled, pipelined path run in CPU-only tests; its tokens must equal the host path's (same
// Sampler, same seed).
#pragma once
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu_wrapper.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace lily::test_support {

class SamplingCpuBackend final : public CpuWrapper {
 public:
  explicit SamplingCpuBackend(std::shared_ptr<const ModelWeights> w) : CpuWrapper(std::move(w)) {}
  std::string name() const override { return "cpu+sampler"; }

  bool can_sample() const override { return true; }
  bool can_mtp() const override { return true; }
  void set_sampling(SequenceState& seq, const DeviceSampling& p, std::span<const int32_t> history) override {
    Seq& s = seqs_[&seq];
    s.p = p;
    s.sampler = std::make_unique<Sampler>(host_sampling(p));
    s.history.assign(history.begin(), history.end());
    s.mask.clear();
  }
  void set_mask(SequenceState& seq, std::span<const uint64_t> mask) override {
    seqs_.at(&seq).mask.assign(mask.begin(), mask.end());
  }

  void begin(const Step& step) override {
    step_ = step;
    for (StepGroup& g : step_.groups) {
      int32_t& t = step_.tokens[size_t(g.first)];
      if (t == kFedToken) t = seqs_.at(g.seq).last;
      if (step.mtp && g.sample) mtp_draws += g.out_rows;
      wants_logits_.push_back(g.logits);
      if (g.sample) g.logits = true;  // the emulated sampler draws from the logits rows
      g.sample = false;
    }
    cpu_.begin(step_);
    step_.groups = step.groups;
  }
  uint64_t end() override {
    const uint64_t t = cpu_.end();
    const size_t V = size_t(weights().cfg.vocab);
    int64_t rows_all = 0;
    for (const StepGroup& g : step_.groups)
      if (g.logits || g.sample) rows_all += g.out_rows;
    std::vector<float> all(size_t(rows_all) * V);
    cpu_.finish(t, StepOutputs{all.data(), nullptr});
    Out o;
    o.ticket = t;
    size_t r = 0;
    for (size_t i = 0; i < step_.groups.size(); ++i) {
      const StepGroup& g = step_.groups[i];
      if (!g.logits && !g.sample) continue;
      const std::span<const float> rows(all.data() + r * V, size_t(g.out_rows) * V);
      r += size_t(g.out_rows);
      if (wants_logits_[i]) o.logits.insert(o.logits.end(), rows.begin(), rows.end());
      if (!g.sample) continue;
      if (step_.mtp) {  // MTP steps: the argmax of each row (lowest id on ties)
        for (int32_t k = 0; k < g.out_rows; ++k) {
          const auto row = rows.subspan(size_t(k) * V, V);
          o.ids.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
        }
        continue;
      }
      Seq& s = seqs_.at(g.seq);
      for (int32_t k = 0; k < g.out_rows; ++k) {
        std::vector<float> l(rows.begin() + k * std::ptrdiff_t(V), rows.begin() + (k + 1) * std::ptrdiff_t(V));
        for (auto [id, b] : s.p.logit_bias)
          if (id >= 0 && size_t(id) < V) l[size_t(id)] += b;
        if (s.p.vocab_limit > 0)
          for (size_t v = size_t(s.p.vocab_limit); v < V; ++v) l[v] = -INFINITY;
        if (!s.mask.empty())
          for (size_t v = 0; v < V; ++v)
            if (!(s.mask[v >> 6] >> (v & 63) & 1)) l[v] = -INFINITY;
        s.last = s.sampler->sample(l, s.history);
        s.history.push_back(s.last);
        o.ids.push_back(s.last);
        ++draws;
      }
      s.mask.clear();
    }
    wants_logits_.clear();
    done_.push_back(std::move(o));
    ++steps;
    return t;
  }
  void finish(uint64_t ticket, const StepOutputs& out) override {
    LILY_ASSERT(!done_.empty() && done_.front().ticket == ticket);
    if (out.logits) std::copy(done_.front().logits.begin(), done_.front().logits.end(), out.logits);
    if (out.ids) std::copy(done_.front().ids.begin(), done_.front().ids.end(), out.ids);
    done_.pop_front();
  }

  int64_t draws = 0;  // ids drawn by the emulated device sampler
  int64_t mtp_draws = 0;  // argmax rows of MTP steps
  int64_t steps = 0;

 private:
  struct Seq {
    DeviceSampling p;
    std::unique_ptr<Sampler> sampler;
    std::vector<int32_t> history;
    std::vector<uint64_t> mask;
    int32_t last = -1;
  };
  struct Out {
    uint64_t ticket = 0;
    std::vector<float> logits;
    std::vector<int32_t> ids;
  };
  Step step_;
  std::vector<bool> wants_logits_;
  std::map<const SequenceState*, Seq> seqs_;
  std::deque<Out> done_;
};

}  // namespace lily::test_support
