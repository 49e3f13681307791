// Gated DeltaNet core of the CUDA backend (gdn.cu, gdn_step.cu, gdn_groups.cu), callable from plain C++.
#pragma once
#include "backend/cuda/ops.h"
#include "backend/cuda/step_desc.h"

namespace lily::cuda {

// ---- Gated DeltaNet core ------------------------------------------------------------------
struct GdnDev {
  int Hk = 0, Hv = 0, dk = 0, dv = 0, K = 0;
  const float* conv = nullptr;     // [C, K]; conv[c*K + j] multiplies the input K-1-j steps back
  const float* dt_bias = nullptr;  // [Hv]
  const float* A_neg = nullptr;    // [Hv]
  const float* norm = nullptr;     // [dv] plain weight
  float eps = 1e-6f;
  int C() const { return 2 * Hk * dk + Hv * dv; }
  int proj_width() const { return C() + Hv * dv + 2 * Hv; }  // qkv | z | b | a
};
size_t gdn_scratch_bytes(const GdnDev& g, int T);
// From the input projections proj [T, proj_width()] to the gated-normed output out [T, Hv·dv].
// conv_state [K-1, C] fp32 (row 0 oldest) and S [Hv, dv, dk] fp32 are read and updated.
// T >= chunk_min uses the chunked rule (C = 64), shorter steps the recurrent form.
// The b|a input projection handed to gdn_core: W [2·Hv, in] times rows x (ldx), RMS-normalised first when
// norm_w is set (only for T <= norm_fuse_rows(), as linear). gdn_core writes proj's b|a columns with it, or for
// one token with bf16 W computes b and a inside the recurrent step kernel (no separate product on the
// decode path).
struct GdnBa {
  const Mat* W = nullptr;
  int in = 0;
  const float* x = nullptr;
  int64_t ldx = 0;
  const float* norm_w = nullptr;
  float eps = 1e-6f;
};
void gdn_core(const GdnDev& g, float* proj, int T, float* conv_state, float* S, float* out, void* scratch,
              cudaStream_t s, int chunk_min = 64, const GdnBa* ba = nullptr);

// Rows up to which a group of a step is short: gdn_groups runs it (recurrent form).
constexpr int kGdnShortRows = 16;
// Rows up to which a sequence's b|a projection may ride in the fused step kernel (GdnBa).
constexpr int kBaFoldRows = 4;
// The short groups list[0 .. groups) of a step of T rows (step form of step_desc.h; each group at most
// kGdnShortRows rows) in one pass: the fused step kernel with a grid dimension over the groups (sm_90 and
// the shapes it takes: gdn_groups_fused), otherwise conv, delta rule and gated norm as three launches over
// the groups. Each group reads its slot's current state version and writes it back, or, tentative, writes
// the conv and recurrent states after its row j into version (cur + 1 + j) % ring. proj and out hold all
// T rows; rows[0 .. n_rows) are the groups' step rows. ba (every group at most kBaFoldRows rows): b|a inside
// the step kernel where it fits, else one product over the T rows. scratch: gdn_scratch_bytes(g, T).
bool gdn_groups_fused(const GdnDev& g);
void gdn_groups(const GdnDev& g, float* proj, int T, const StepSeqs& seqs, const int32_t* list, int groups,
                const int32_t* rows, int n_rows, float* out, void* scratch, cudaStream_t s, const GdnBa* ba = nullptr);

}  // namespace lily::cuda
