// Tensor-core GEMM for prompts (mma.sync m16n8k16, bf16 or fp16 operands -> fp32), dense or over an expert tile map.
#pragma once
#include "backend/cuda/ops.h"
#include "backend/cuda/switches.h"

namespace lily::cuda {

// GemmPrec (switches.h): kBf16 and kFp16 one MMA per step, kSplit two (bf16 weights) or three (affine).

// The precision gemm_tiles uses for W: KernelSwitches::gemm_prec when W's class (Mat::cls) is in
// KernelSwitches::reduced_classes, kSplit otherwise (switches.h).
GemmPrec gemm_prec_for(const Mat& W);

// Same contract as gemm_tiles (ops.h), x_rows included. Returns false, launching nothing, when the fast path
// cannot take the shape (in not a multiple of 32, unaligned rows, affine bits other than 4/8 or a group size not
// a multiple of 32); the caller then runs the SIMT kernel.
bool gemm_tc(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
             bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, GemmPrec prec,
             cudaStream_t s, int x_rows = 0);

// linear() (ops.h) whose many-row products take the split precision whatever KernelSwitches says (EXL3
// weights: as linear): for the MoE router (unless its class is chosen for bf16), whose logits feed the top-k. A bf16 rounding of its input
// flips near-tied experts, a discrete change of that row and, through the recurrent state and the keys, of
// the rows after it (on the golden models most of the bf16 mode's KL to the reference came from it).
void linear_split(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy,
                  cudaStream_t s, const float* norm_w = nullptr, float eps = 1e-6f);

}  // namespace lily::cuda
