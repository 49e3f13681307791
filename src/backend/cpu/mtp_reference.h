// Plain float32 reference of the MTP head (model doc §5), outside the Backend seam: the specification a
// backend's MTP forward is held to. One sequence; the MTP layer keeps its own fp32 KV cache, and its RoPE
// positions 0, 1, ... count the pairs it has absorbed:
//   e  = RMSNorm(embed[x], pre_fc_norm_embedding)     hh = RMSNorm(h, pre_fc_norm_hidden)
//   z  = fc([e ‖ hh]);  z += Attn(RMSNorm(z, input_norm));  z += FFN(RMSNorm(z, post_norm))
//   h' = RMSNorm(z, mtp.norm);  logits = h' · lm_headᵀ
// Teacher forcing feeds the pair (x_{t+1}, h_t), h_t the main model's state after its final norm; a draft
// chain feeds the drafted token with h' of the previous MTP step.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"

namespace lily::cpu {

class MtpReference {
 public:
  // Throws InputError naming the missing tensors when the model has no MTP block. Products take `path`
  // for affine 4/8-bit weights (Exact: float activations).
  explicit MtpReference(const ModelWeights& w, AffinePath path = AffinePath::Exact);

  int64_t n_tokens() const { return n_; }  // pairs absorbed (the next position)
  void reset();

  // Absorbs the pairs (tokens[i], hidden[i * H ...]) at positions n_tokens() + i. Writes h' [T, H] when
  // h_out is non-null and logits [T, V] when logits is non-null.
  void step(std::span<const int32_t> tokens, const float* hidden, float* h_out, float* logits);

 private:
  void attention(const float* u, int64_t T, float* out);
  void ffn(const float* u, int64_t T, float* out);
  void mm(const Linear& W, const float* x, int64_t T, float* y) const { matmul(W, x, T, y, path_); }

  const ModelWeights& w_;
  const MtpWeights& m_;
  AffinePath path_;
  int64_t n_ = 0;
  std::vector<float> k_, v_;  // KV cache [n][Hkv·hd], k after q/k-norm and RoPE
};

// Teacher-forced MTP logits [T-1, V] (T = tokens.size() ≥ 2): row t from the pair (tokens[t+1],
// hidden[t]) at MTP position t, hidden [T, H] the main model's states after its final norm.
std::vector<float> mtp_teacher_forced(const ModelWeights& w, std::span<const int32_t> tokens, const float* hidden,
                                      AffinePath path = AffinePath::Exact);

// Greedy MTP draft of `depth` tokens after a verified prefix: the reference absorbs the pairs
// (tokens[t+1], hidden[t]) for t < T-1 (tokens[T-1] is the last verified token), drafts the argmax, and
// each further draft feeds the drafted token with the previous step's h'.
std::vector<int32_t> mtp_greedy_draft(const ModelWeights& w, std::span<const int32_t> tokens, const float* hidden,
                                      int64_t depth, AffinePath path = AffinePath::Exact);

// Runs `tokens` through the main model on the CPU backend after the tokens already in `st`, in steps of
// at most `chunk` rows, and returns its states after the final norm [T, H] (the residual of each step,
// CpuBackend::residual(), normed as head() norms it). logits [T, V] receives every row when non-null.
std::vector<float> final_hidden_states(CpuBackend& be, SequenceState& st, std::span<const int32_t> tokens,
                                       int64_t chunk, float* logits);

}  // namespace lily::cpu
