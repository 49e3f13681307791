// Gated attention core of the CUDA backend (attn.cu), callable from plain C++.
#pragma once
#include "backend/cuda/ops.h"
#include "backend/cuda/step_desc.h"

namespace lily::cuda {

// ---- gated attention core -----------------------------------------------------------------
struct AttnDev {
  int Hq = 0, Hkv = 0, hd = 0, rot = 0;
  float theta = 1e4f, eps = 1e-6f;
  const float* q_norm = nullptr;  // [hd] folded
  const float* k_norm = nullptr;  // [hd] folded
  const float* inv_freq = nullptr;  // [rot/2] RoPE inverse frequencies; null: theta^(-2i/rot) in fp32
  int proj_width() const { return Hq * 2 * hd + 2 * Hkv * hd; }  // q|gate per head, k, v
};
// Split-KV factor for T new rows of each of `groups` sequences batched in one launch, after at most
// ctx_max cached tokens (a launch shape; any value >= 1 is correct).
int attn_splits(const AttnDev& a, int T, int64_t ctx_max, int groups = 1);
// Scratch of attn_core (q, then the split partials); the parts: q [T][Hq][hd], partials of T rows.
size_t attn_scratch_bytes(const AttnDev& a, int T, int nsplit);
size_t attn_q_bytes(const AttnDev& a, int T);
size_t attn_partials_bytes(const AttnDev& a, int T, int nsplit);
// Packed rows (G·T for a group of T rows, G = Hq / Hkv) up to which a group takes the decode kernel.
constexpr int kAttnDecodeRows = 8;
// Rows up to which a step of one sequence beyond kAttnDecodeRows packed rows runs the decode kernel per token
// block (KernelSwitches::attn_token_blocks). 4: on the H100 at 4K keys verify 2 / 3 rows −2%, 4 rows level,
// 8 rows +2% (each block re-reads the keys).
constexpr int kAttnTokenBlocksMax = 4;
// True when the decode kernel runs head_dim hd on this device (attn_decode_groups needs it).
bool attn_decode_covers(int hd);

// q/k norm + partial RoPE + KV append (bf16 cache [Hkv, cap, hd]) + causal GQA attention + sigmoid gate.
// *pos (device) = tokens already cached; the T rows sit at positions *pos .. *pos + T - 1.
void attn_core(const AttnDev& a, const float* proj, int T, const int64_t* pos, uint16_t* k_cache,
               uint16_t* v_cache, int64_t cap, int nsplit, float* out, void* scratch, cudaStream_t s);

// The parts of attn_core for the rows of a step (step_desc.h):
// q/k norm, RoPE, and the KV append of each of the T rows at its sequence's cache and position; q [T][Hq][hd].
void attn_prep(const AttnDev& a, const float* proj, int T, const StepSeqs& seqs, float* q, cudaStream_t s);
// The attention of one sequence's T rows after attn_prep: q, proj and out point at its first row, *pos is
// its position; partials: attn_partials_bytes(a, T, nsplit).
void attn_rows(const AttnDev& a, const float* q, const float* proj, int T, const int64_t* pos, const uint16_t* k_cache,
               const uint16_t* v_cache, int64_t cap, int nsplit, float* out, void* partials, cudaStream_t s);
// The groups list[0 .. groups) of a step of T rows (each with G·rows <= kAttnDecodeRows packed rows) after
// attn_prep, in one decode launch (grid over the groups, each reading its slot's cache) and one combine over
// their step rows rows[0 .. n_rows); q, proj and out hold all T rows; partials: attn_partials_bytes(a, T, nsplit).
void attn_decode_groups(const AttnDev& a, const float* q, const float* proj, int T, const StepSeqs& seqs, const int32_t* list,
                        int groups, const int32_t* rows, int n_rows, int nsplit, float* out, void* partials, cudaStream_t s);

}  // namespace lily::cuda
