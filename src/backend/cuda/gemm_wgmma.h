// Hopper GEMM for prompt products on wgmma (sm_90a): dense rows or a grouped product over the expert tile
// map, bf16 or fp16 operands (GemmPrec::kBf16 / kFp16; the input rows staged once by gemm_stage.h), fp32
// accumulation and output. Same contract as gemm_tiles (ops.h), with tiles of up to kGemmUnitRows (128) rows.
#pragma once
#include "backend/cuda/ops.h"
#include "backend/cuda/switches.h"

namespace lily::cuda {

// The shapes and weights gemm_wgmma takes (host check, no device needed): bf16 weights with ld and the expert
// stride multiples of 8, or MLX affine 4/8-bit with a group size that is a multiple of 32 and divides `in`,
// 16-byte aligned code rows; in a multiple of 8, x 16-byte aligned with ldx % 4 == 0.
bool gemm_wgmma_takes(const Mat& W, int in, const float* x, int64_t ldx);

// True on a device of compute capability 9.0 in a binary that carries the sm_90a kernel.
bool gemm_wgmma_device();

// Whether KernelSwitches::gemm_wgmma asks for W on the wgmma kernels (gemm_wgmma_takes decides whether they can).
bool gemm_wgmma_wanted(const Mat& W);

// y[r, 0:out] (= or +=) x[gather[r], 0:in] · W_eᵀ over the tile map (tiles, n_tiles, max_tiles; rows below T) or,
// with tiles == null, dense rows 0..T-1. prec kBf16 or kFp16 (kSplit: declined). Returns false, launching
// nothing, when the device, the precision or the shape is not covered (the caller then runs gemm_tc).
bool gemm_wgmma(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
                bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, GemmPrec prec,
                cudaStream_t s);

void init_gemm_wgmma_kernels();

}  // namespace lily::cuda
