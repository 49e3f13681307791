// Test support: a backend that runs the CPU backend's steps and changes what comes out of them (the
// emulated device sampler, scripted logits): the model, its states and its layers are the CPU backend's.
#pragma once
#include <memory>
#include <utility>

#include "backend/cpu/cpu_backend.h"

namespace lily::test_support {

class CpuWrapper : public Backend {
 public:
  explicit CpuWrapper(std::shared_ptr<const ModelWeights> w) : cpu_(std::move(w)) {}
  const ModelWeights& weights() const override { return cpu_.weights(); }
  std::unique_ptr<SequenceState> new_state(int64_t n) override { return cpu_.new_state(n); }
  void embed() override { cpu_.embed(); }
  void gdn_mixer(int l) override { cpu_.gdn_mixer(l); }
  void attn_mixer(int l) override { cpu_.attn_mixer(l); }
  void ffn(int l) override { cpu_.ffn(l); }
  void head() override { cpu_.head(); }

 protected:
  cpu::CpuBackend cpu_;
};

}  // namespace lily::test_support
