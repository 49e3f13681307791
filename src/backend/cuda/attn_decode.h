// The decode attention kernel (attn_decode.cu): R = G·T <= kDecRows packed rows (token, query head of one
// KV head's group) per KV head, on the tensor cores at fp32-grade precision, split over the key range.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/attn.h"

namespace lily::cuda {

constexpr int kDecRows = 8, kDecSub = 16;  // packed rows at most, keys per sub-tile

// Opts the kernels into the shared memory they need where the device's per-block opt-in limit allows.
void init_attn_decode_kernels(int smem_optin);
// Whether the kernel's rings fit the device's shared memory at head size hd (after the init).
bool attn_decode_fits(int hd);
// Grid (Hkv, nsplit, groups), see the kernel. po / pm / pl: the split partials (nsplit > 1), else unused.
// Without list, zrows > 0 cuts the call's T rows of one sequence into groups = cdiv(T, zrows) z-blocks of zrows
// consecutive tokens each (G·zrows <= kDecRows); 0: one z-block takes all T rows.
void attn_decode_launch(const AttnDev& a, const float* q, const float* proj, int T, const StepSeqs& seqs, const int32_t* list,
                        int groups, int nsplit, float* out, float* po, float* pm, float* pl, cudaStream_t s, int zrows = 0);

}  // namespace lily::cuda
