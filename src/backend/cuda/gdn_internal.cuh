// Internals of the Gated DeltaNet kernels shared by gdn.cu (one sequence: conv, recurrence, chunked
// rule), gdn_step.cu (the fused step kernel) and gdn_groups.cu (the short groups of a step).
#pragma once
#include "backend/cuda/gdn.h"
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {

constexpr int kFusedMaxT = 16;  // steps (groups) up to this many rows may take the fused step kernel

// Scratch of the unfused stages: conv outputs [T][C], normalised q and k [T][Hk][dk], g and beta [T][Hv].
struct GdnScratch {
  float *conv_out, *qn, *kn, *g, *beta;
  size_t bytes;
};
GdnScratch gdn_layout(const GdnDev& d, int T, void* base);

// b|a folded into the step (each of a sequence's 1..kBaFoldRows tokens): rows j and Hv + j of the bf16 W
// [2·Hv, H] (row stride ld) times RMSNorm(x)·norm_w (norm_w null: x is normalised already); w == null: proj
// holds b|a. H % 8 == 0 and H <= 8·kStepThreads·kBaMaxU.
constexpr int kBaMaxU = 2;
struct BaFold {
  const uint16_t* w = nullptr;
  int64_t ld = 0;
  int H = 0;
  const float* x = nullptr;  // row 0 of the call (a group's row: x + first·ldx)
  int64_t ldx = 0;
  const float* norm_w = nullptr;
  float eps = 0.f;
};

// Step kernel split of a key head (gdn_step.cu): ns slices per value head, rwp rows per warp; ns = 0: the
// shape (or the device) cannot take the step kernel.
struct StepSplit {
  int ns = 0, rwp = 0;
};
StepSplit gdn_fused_split(const GdnDev& g);
// The b|a fold of the step kernel fits (bf16 W, widths within the kernel's reach; sequences of at most
// kBaFoldRows rows).
bool gdn_fold_fits(const GdnBa& ba);
// The fused step kernel over `groups` grids of one cluster per key head (list == null: one sequence at
// conv_state / S; else the step's groups list[0 .. groups)).
void gdn_launch_step(const GdnDev& g, const StepSplit& sp, float* proj, int T, float* conv_state, float* S, float* out,
                     const BaFold& fold, const StepSeqs& seqs, const int32_t* list, int groups, cudaStream_t s);

}  // namespace lily::cuda
