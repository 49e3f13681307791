// Tensor-core GEMM for prompts (mma.sync m16n8k16 bf16 x bf16 -> fp32), dense or over an expert tile map.
#pragma once
#include "backend/cuda/ops.h"

namespace lily::cuda {

// kBf16: activations rounded to bf16 once (affine weights dequantised to bf16): one MMA per step,
//        |error| <= ~2^-8 · Σ|x|·|w| per output.
// kSplit: activations (and affine weights) split into bf16 hi + lo parts, two (three) MMAs per step:
//        ~fp32-class results (|error| ~ 2^-17 · Σ|x|·|w|), the accuracy of the SIMT kernel.
enum class GemmPrec { kBf16, kSplit };

// The precision gemm_tiles uses: kSplit, or kBf16 with KernelSwitches::gemm_bf16 (switches.h).
GemmPrec gemm_tc_default_precision();

// Same contract as gemm_tiles (ops.h). Returns false, launching nothing, when the fast path cannot take the
// shape (in not a multiple of 32, unaligned rows, affine bits other than 4/8 or a group size not a multiple
// of 32); the caller then runs the SIMT kernel.
bool gemm_tc(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
             bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, GemmPrec prec,
             cudaStream_t s);

}  // namespace lily::cuda
