// Multi-row products for decode steps of 3..32 rows (gemv_rows.cu): every block streams a tile of weight
// rows once and multiplies it by all the rows that use it, on the tensor cores (mma.sync m16n8k16, the
// rows as the N side, fp32 accumulation). Dense products take the step's rows as one group; the MoE takes
// per-expert row lists from the device tile map (route_kernel in moe.cu), so each expert chosen by the
// step is read once per kRowsTile of its rows and experts chosen by none cost nothing.
//
// Numerics: activations split into bf16 hi + lo (two MMAs); affine codes enter the MMA as exact centred
// integers q' = q - 2^(bits-1) and each 64-wide k chunk folds as s·Σq'·x + (b + 2^(bits-1)·s)·Σx in fp32
// (the GEMV's s·Σq·x + b·Σx without its cancellation). A row's result depends on its
// own input only: the same bits whichever rows share the step (the k-split is chosen from the matrix shape
// and, for the MoE, the step's slot count).
#pragma once
#include "backend/cuda/ops.h"

namespace lily::cuda {

constexpr int kRowsTile = 8;  // rows per expert tile of the grouped MoE product
constexpr int kRowsMax = 32;  // rows of one dense multi-row product

// Whether the multi-row product takes W with input width `in` (bf16 with 16-byte aligned rows, affine
// 4/8-bit with a group size that is a multiple of 64; in a multiple of 64). EXL3 has exl3_rows.
bool rows_covers(const Mat& W, int in);

// y[r, 0:out] (= or +=) x[gather[r], 0:in] · W_eᵀ, the gemm_tiles contract (ops.h) with tiles of at most
// kRowsTile rows; tiles == null: dense, rows [0, T) for T <= kRowsMax. swiglu_I > 0: W holds gate rows
// [0, I) and up rows [I, 2I), y[r, j] = silu(gate_j · x) · (up_j · x) for j < I (out ignored).
// x rows 16-byte aligned (ldx % 4 == 0). norm_w: each x row RMS-normalised (· norm_w, eps) as it is read.
// x_rows: with a gather, the rows of x it may name (0: unknown, no staging pass); KernelSwitches::rows_stage
// then stages x first (rows_stage.h: same bits). Returns false, launching nothing, when the product is not covered.
bool rows_product(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y,
                  int64_t ldy, bool accumulate, int swiglu_I, const int32_t* tiles, const int32_t* n_tiles,
                  int max_tiles, int T, cudaStream_t s, const float* norm_w = nullptr, float eps = 1e-6f,
                  int x_rows = 0);

// Dense product of T rows through rows_product (EXL3: exl3_rows, no SwiGLU, no fused norm) when
// KernelSwitches takes T (max(3, rows_min or rows_min_exl3) <= T <= rows_dense) and the format is covered; false otherwise
// (nothing launched). norm_w as rows_product.
bool rows_linear(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy,
                 bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w = nullptr, float eps = 1e-6f);

// EXL3 dense product of T <= 64 rows (exl3.cu): the tile GEMM (each weight decoded once for all rows) with
// its k chunks split over thread-block clusters when the column blocks alone do not fill the GPU. False
// (nothing launched) for other formats.
bool exl3_rows(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy, bool accumulate,
               cudaStream_t s);

// Whether MoE steps of T rows group their slots per expert (max(3, rows_min) <= T <= rows_moe; EXL3 experts:
// rows_min_exl3).
bool rows_moe_on(int T, bool exl3);

}  // namespace lily::cuda
