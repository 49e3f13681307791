// Device operations of the CUDA ranks (shard_*.cpp; backend/rank_backend.h): the residual sums, the MoE
// over a rank's expert range, the vocabulary-split argmax, and weights drawn on the device (the on-device
// synth). Plain C++ callable; pointers are device pointers, every call asynchronous on `s`.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/ops.h"

namespace lily::cuda {

// x[i] += p[i], i < n.
void add_into(float* x, const float* p, size_t n, cudaStream_t s);
// dst[i] = Σ_j src[j][i] (j < nsrc <= 64), i < n; dst may be one of the sources.
void sum_buffers(float* dst, const float* const* src, int nsrc, size_t n, cudaStream_t s);

// ---- MoE of one rank: experts [e0, e0 + E_local) of the router's E_global, the shared expert (or a
// share of it) beside them.
struct RankMoeScratch {
  float *logits, *w, *gu, *h, *yb, *sh_gu, *sh_h, *ysh, *sg;
  int32_t *idx, *slot_pos, *sorted_tok, *tiles, *n_tiles, *counts;
  size_t bytes;
};
// kk: slots per token (top-k, + 1 when the shared expert rides in the stacks as local expert E_local);
// tile_rows: rows per expert tile of the grouped products.
RankMoeScratch rank_moe_layout(void* base, int T, int kk, int E_global, int E_local, int I, int Is, int H, int tile_rows);
// Router logits [T, ldl] -> per token kk (expert, weight) slots with the routed experts' global ids (moe.cu's
// top-k; with `shared` a last slot for expert E_global weighted sigmoid(logits[E_global]) or 1), then the
// ids mapped to the rank's stacks: e0 + i -> i, E_global -> E_local (the shared expert in the stacks), any
// other expert -> -1 (another rank's).
void rank_topk(const float* logits, int ldl, int T, int E_global, int k, bool norm_topk, bool shared, bool shared_gated,
               int e0, int E_local, int32_t* idx, float* w, cudaStream_t s);
// Slots sorted per local expert (-1 slots dropped): counts [En + 1], slot_pos [n] (-1: dropped),
// sorted_tok [n] (token of each sorted slot), tiles of at most tile_rows rows (moe.cu's tile map).
void rank_route(const int32_t* idx, int n, int En, int kk, int tile_rows, int32_t* counts, int32_t* slot_pos,
                int32_t* sorted_tok, int32_t* tiles, int32_t* n_tiles, cudaStream_t s);
// h[r, c] = silu(gu[r, c]) · gu[r, I + c], r < rows.
void swiglu_rows(const float* gu, int I, int64_t rows, float* h, cudaStream_t s);
// y[t] = Σ_j w[t, j] · yb[slot_pos[t, j]] over the slots kept (slot_pos >= 0) + gate(t) · ysh[t] (ysh null:
// none; sg null: gate 1, else sigmoid(sg[t · sg_ld])).
void rank_combine(float* y, int T, int H, int kk, const float* w, const int32_t* slot_pos, const float* yb, const float* ysh,
                  const float* sg, int sg_ld, cudaStream_t s);

// ---- vocabulary-split argmax: a rank's logits columns [v0, v0 + Vr) of rows row_index[r] (r < S) ->
// cand[r · ld + c0] = max, cand[... + 1] = its global id (float bits); lowest id on ties, NaN never wins.
void slice_argmax(const float* logits, int64_t V, int64_t v0, int64_t Vr, const int32_t* row_index, int S, float* cand,
                  int64_t ld, int64_t c0, cudaStream_t s);
// The best of the ranks' candidates per row (pairs at columns 2q, q < nranks): out[r] = id, and fed[fed_slot[r]]
// where fed_slot[r] >= 0 (argmax()'s outputs).
void pick_argmax(const float* cand, int64_t ld, int nranks, int S, int32_t* out, const int32_t* fed_slot, int32_t* fed,
                 cudaStream_t s);

// ---- weights drawn on the device (SynthOptions::shapes_only): streams keyed by `key`.
void synth_bf16(uint16_t* w, int64_t rows, int64_t cols, int64_t ld, uint64_t key, float a, cudaStream_t s);  // U(-a, a)
void synth_words(uint32_t* w, size_t n, uint64_t key, cudaStream_t s);                                   // random bits
void synth_fill16(uint16_t* w, size_t n, uint16_t v, cudaStream_t s);                                    // constant
void synth_signs16(uint16_t* w, size_t n, uint64_t key, uint16_t pos, uint16_t neg, cudaStream_t s);     // ± at random

}  // namespace lily::cuda
