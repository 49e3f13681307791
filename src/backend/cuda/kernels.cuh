// Internal launchers shared between the .cu files of the CUDA backend.
#pragma once
#include "backend/cuda/common.cuh"

namespace lily::cuda {

constexpr int kGemmBM = 64;  // rows of x per GEMM tile
constexpr int kGemmBN = 64;  // output columns per GEMM tile

// Row-parallel GEMV over `slots`: slot s reads weight matrix W + expert[s]·wstride (expert null: W),
// input row x + (s / xdiv)·ldx and writes y + s·ldy. swiglu_I > 0: W holds gate rows [0, I) and up rows
// [I, 2I); y[r] = silu(gate_r · x) · (up_r · x) for r < I (out is ignored).
void gemv_slots(const uint16_t* W, int64_t ldw, int64_t wstride, const int32_t* expert, int out, int in,
                const float* x, int64_t ldx, int xdiv, int slots, float* y, int64_t ldy, bool accumulate,
                int swiglu_I, cudaStream_t s);

// Tiled GEMM. Tile i covers rows [row0, row0 + nrows) (at most kGemmBM) of expert e, from
// tiles[3i .. 3i+2] = {e, row0, nrows}; *n_tiles (device) of max_tiles are live. tiles == null: dense,
// tile i = rows [64 i, min(64 i + 64, T)). Row r of the product reads x row gather[r] (null: r) and
// writes y row r.
void gemm_tiles(const uint16_t* W, int64_t ldw, int64_t wstride, int out, int in, const float* x, int64_t ldx,
                const int32_t* gather, float* y, int64_t ldy, bool accumulate, const int32_t* tiles,
                const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s);

}  // namespace lily::cuda
