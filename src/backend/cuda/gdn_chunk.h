// Chunked gated delta rule for prompts (model doc §4), split into a pass parallel over (value head,
// chunk) and a pass serial over chunks that carries only the state. Called by gdn_core after the conv
// and prep kernels; plain C++ may include this header (tests, benches).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace lily::cuda {

// True when gdn_chunk_fast handles this head shape (dk 32, 64 or 128; dv bounded by shared memory)
// and the path is enabled.
bool gdn_chunk_fast_covers(int dk, int dv);
// Tests and benches only: false routes gdn_core back to the single-pass reference chunk kernel.
void gdn_chunk_fast_enable(bool on);
// Device scratch of gdn_chunk_fast for T rows (256-byte aligned base).
size_t gdn_chunk_scratch_bytes(int T, int Hv, int dk, int dv);
// Raises the shared-memory limits of the kernels (once per device, with init_kernels).
void init_gdn_chunk_kernels();

// Inputs as gdn_core's prep stage leaves them: qn, kn [T, Hk, dk] (q already scaled by 1/sqrt(dk)),
// values at xc[t·C + 2·Hk·dk + j·dv + d] with C = 2·Hk·dk + Hv·dv, g (log-decay) and beta [T, Hv].
// S [Hv, dv, dk] fp32 is read and updated; o [T, Hv·dv] receives the delta-rule output (before the
// gated norm). Chunks of 64 rows, the last one partial.
void gdn_chunk_fast(const float* qn, const float* kn, const float* xc, const float* g, const float* beta, int T, int Hk,
                    int Hv, int dk, int dv, float* S, float* o, void* scratch, cudaStream_t s);

}  // namespace lily::cuda
