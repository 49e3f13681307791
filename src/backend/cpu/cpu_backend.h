// CPU backend: float32 implementation of every block (the executable specification), with threaded
// matmuls and heads processed in parallel. State: fp32 KV cache [pos][Hkv·hd] per attention layer,
// conv state (last K-1 pre-conv qkv rows) and fp32 recurrent state [Hv][dv][dk] per DeltaNet layer.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"

namespace lily::cpu {

struct CpuOptions {
  // Steps of at most this many rows use the recurrent delta rule; longer ones the chunked form.
  int64_t recurrent_max_rows = 16;
  // Affine 4/8-bit products: int8 activations (fast) or float activations (exact; see matmul.h).
  AffinePath affine = affine_path_default();
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::shared_ptr<const ModelWeights> w, CpuOptions opt = {});
  std::string name() const override { return "cpu"; }
  const ModelWeights& weights() const override { return *w_; }
  std::unique_ptr<SequenceState> new_state(int64_t max_tokens) override;

  void begin(SequenceState& st, int64_t T) override;
  void embed(const int32_t* tokens) override;
  void gdn_mixer(int layer) override;
  void attn_mixer(int layer) override;
  void ffn(int layer) override;
  void head(int64_t rows, float* logits) override;
  void end() override;
  size_t peak_memory() const override { return peak_; }

  // Residual stream of the current step [T, H] (tests read it).
  const std::vector<float>& residual() const { return x_; }
  CpuOptions& options() { return opt_; }

 private:
  void expert_mlp(const Expert& e, const float* u, int64_t rows, float* out);
  void mm(const Linear& W, const float* x, int64_t T, float* y) const { matmul(W, x, T, y, opt_.affine); }

  std::shared_ptr<const ModelWeights> w_;
  CpuOptions opt_;
  class CpuState* st_ = nullptr;
  int64_t T_ = 0, pos0_ = 0;
  std::vector<float> x_, u_;  // residual, normed input
  std::vector<float> a_, b_, c_, d_, e_;  // scratch
  size_t peak_ = 0;
};

}  // namespace lily::cpu
