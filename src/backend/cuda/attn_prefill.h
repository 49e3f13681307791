// Prompt attention on the tensor cores (attn_prefill.cu), called by attn_core for more than 8 packed rows.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lily::cuda {

constexpr int kPrefillRows = 64;  // packed query rows (token, query head of one KV head's group) per block

inline bool attn_prefill_supported(int hd) { return hd == 64 || hd == 128 || hd == 256; }

// Same contract as the SIMT attn_kernel of attn.cu: q [T][Hq][hd] fp32 (normed, roped, scaled by
// 1/sqrt(hd)); keys/values [Hkv][cap][hd] bf16 with this call's rows already appended at *pos; row r of
// KV head h is token r / G, query head h·G + r % G (G = Hq / Hkv) and sees keys [0, *pos + r / G].
// nsplit == 1: out [T][Hq·hd] = softmax(q kᵀ) v · sigmoid(gate); nsplit > 1: split s covers keys
// [s·chunk, (s+1)·chunk), chunk = ceil((*pos + T) / nsplit), and writes the unnormalised partials
// po [nsplit][Hkv][R][hd], running max pm and sum pl [nsplit][Hkv][R] for attn_combine_kernel.
void attn_prefill(const float* q, const float* proj, int64_t ldp, int T, int Hq, int Hkv, int hd, const int64_t* pos,
                  const uint16_t* kc, const uint16_t* vc, int64_t cap, int nsplit, float* out, float* po, float* pm,
                  float* pl, cudaStream_t s);
void init_attn_prefill_kernels();
// Test hook: true routes attn_core's prompt path to the SIMT reference kernel of attn.cu (default false).
void set_attn_prefill_simt(bool on);
bool attn_prefill_simt();

}  // namespace lily::cuda
