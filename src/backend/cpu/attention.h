// Causal softmax attention of one step's rows against their sequences' KV caches (fp32, GQA), then the
// output gate: o[t][h] = softmax(q[t][h] · K[0..pos_t]ᵀ · scale) · V[0..pos_t] ⊙ sigmoid(gate[t][h]).
#pragma once
#include <cstdint>
#include <vector>

namespace lily::cpu {

// One sequence's rows of the step: rows [first, first + rows), row first + i at position pos0 + i, against
// the sequence's cache k, v: [n][Hkv·hd] with n >= pos0 + rows (the step's rows already appended).
struct AttnSeq {
  const float *k, *v;
  int64_t first, rows, pos0;
};

struct AttnArgs {
  const float* q;     // [T][Hq][hd]
  const float* gate;  // row t, head h: gate + t·gate_ts + h·gate_hs, hd values
  int64_t gate_ts, gate_hs;
  float* o;  // [T][Hq][hd]
  int64_t Hq, Hkv, hd;
  float scale;
  // Sequences with at least this many rows in the step go as blocks of rows through gemm_nn (scores for
  // 16 rows × the query heads of one KV head at once); shorter ones row by row (dot products per key).
  int64_t block_min_rows = 16;
};

void attention(const AttnArgs& a, const std::vector<AttnSeq>& seqs);

}  // namespace lily::cpu
