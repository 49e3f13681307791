// Tensor-core GEMM for prompts (mma.sync m16n8k16 bf16 x bf16 -> fp32), dense or over an expert tile map.
#pragma once
#include "backend/cuda/ops.h"
#include "backend/cuda/switches.h"

namespace lily::cuda {

// GemmPrec (switches.h): kBf16 one MMA per step, kSplit two (bf16 weights) or three (affine).

// The precision gemm_tiles uses: KernelSwitches::gemm_prec (switches.h).
GemmPrec gemm_tc_default_precision();

// Same contract as gemm_tiles (ops.h). Returns false, launching nothing, when the fast path cannot take the
// shape (in not a multiple of 32, unaligned rows, affine bits other than 4/8 or a group size not a multiple
// of 32); the caller then runs the SIMT kernel.
bool gemm_tc(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
             bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, GemmPrec prec,
             cudaStream_t s);

}  // namespace lily::cuda
