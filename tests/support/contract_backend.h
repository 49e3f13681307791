// Test support: the CPU backend plus a host implementation of Backend::decode_on_device's contract
// (backend/backend.h), drawing with the host Sampler, so the tokens it emits must equal the host loop's.
// Lets the runtime and server paths that use on-device decoding run in CPU-only tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/qwen_hybrid.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace lily::test_support {

class ContractBackend final : public Backend {
 public:
  explicit ContractBackend(std::shared_ptr<const ModelWeights> w) : cpu_(std::move(w)) {}
  std::string name() const override { return "cpu+contract"; }
  const ModelWeights& weights() const override { return cpu_.weights(); }
  std::unique_ptr<SequenceState> new_state(int64_t n) override { return cpu_.new_state(n); }
  void begin(SequenceState& st, int64_t T) override { cpu_.begin(st, T); }
  void embed(const int32_t* t) override { cpu_.embed(t); }
  void gdn_mixer(int l) override { cpu_.gdn_mixer(l); }
  void attn_mixer(int l) override { cpu_.attn_mixer(l); }
  void ffn(int l) override { cpu_.ffn(l); }
  void head(int64_t rows, float* logits) override { cpu_.head(rows, logits); }
  void end() override { cpu_.end(); }

  bool can_decode_on_device() const override { return true; }
  DeviceDecodeResult decode_on_device(SequenceState& st, const DeviceDecode& req, const std::function<bool(int32_t)>& on_token,
                                      float* last_logits) override {
    ++calls;
    DeviceDecodeResult r;
    if (req.max_tokens <= 0) return r;
    Sampler sampler(host_sampling(req.sampling));
    const size_t V = size_t(weights().cfg.vocab);
    std::vector<float> l(req.first_logits, req.first_logits + V);
    std::vector<int32_t> hist(req.history.begin(), req.history.end());
    for (int64_t i = 0;; ++i) {
      if (req.vocab_limit > 0)
        for (size_t t = size_t(req.vocab_limit); t < V; ++t) l[t] = -INFINITY;
      const int32_t t = sampler.sample(l, hist);
      hist.push_back(t);
      r.tokens.push_back(t);
      ++tokens;
      // absorbed as soon as emitted (a device runs this step while the host checks the id)
      const bool fits = st.n_tokens() + 1 <= st.capacity();
      if (fits) {
        forward_step(*this, st, std::span<const int32_t>(&t, 1), 1, l.data());
        ++r.absorbed;
      }
      const bool is_stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), t) != req.stop_ids.end();
      if (on_token && !on_token(t)) { r.stopped = true; break; }
      if (is_stop) { r.stopped = true; break; }
      if (i + 1 == req.max_tokens) break;
      if (!fits) break;
    }
    if (r.absorbed > 0 && last_logits) std::copy(l.begin(), l.end(), last_logits);
    return r;
  }
  int calls = 0;       // decode_on_device calls
  int64_t tokens = 0;  // tokens emitted by them

 private:
  cpu::CpuBackend cpu_;
};

}  // namespace lily::test_support
