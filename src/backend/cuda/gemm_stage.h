// Input staging of the prompt GEMMs, into device buffers of the stream:
//   - row scales of the fp16 mode (GemmPrec::kFp16; the rule in backend/fp16_scale.h) for the mma.sync and EXL3
//     kernels, which convert the fp32 rows themselves;
//   - 16-bit copies of the input rows for the wgmma kernel: fp32 -> bf16 (or scaled fp16), gathered into
//     product-row order once per product, so that its A operand is a plain matrix the copy engine reads.
#pragma once
#include "backend/cuda/ops.h"
#include "backend/fp16_scale.h"

namespace lily::cuda {

// s[i] = 2^e of row i; by_src: i is the x row a product row reads (gather[r], or r), else the product row r.
struct RowScales {
  const float* s = nullptr;
  bool by_src = false;
};

// The scales of the rows a product of the gemm_tiles contract (ops.h) reads. x_rows > 0: of x rows
// 0..x_rows-1 (every row a gather may name; each row once, indexed by source row). x_rows == 0: of the
// product rows the tile map's live tiles name (rows below T), or of dense rows 0..T-1.
RowScales row_scales(const float* x, int64_t ldx, int in, const int32_t* gather, const int32_t* tiles,
                     const int32_t* n_tiles, int max_tiles, int T, int x_rows, cudaStream_t s);

// The input rows of a product as a 16-bit matrix a [T, ld] in product-row order: row r = x[gather[r]] (or x[r])
// for the rows the live tiles name (tiles of up to kGemmUnitRows rows; other rows hold stale values), or dense
// rows 0..T-1. fp16: each row times its power of two, s[r] (else s is null). perm_bits 0: ld = in rounded up to
// 8, columns in order; 4, 8 or 16: ld = in rounded up to 64, column 64b + kl holding x column 64b +
// rs_phys_k(perm_bits, kl) (gemm_wgmma_rs.h; zero past in).
constexpr int kGemmUnitRows = 128;
struct StagedRows {
  const uint16_t* a = nullptr;
  int64_t ld = 0;
  const float* s = nullptr;
};
StagedRows stage_rows(bool fp16, const float* x, int64_t ldx, int in, const int32_t* gather, const int32_t* tiles,
                      const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s, int perm_bits = 0);

// The buffers live per (device, stream); the stream's next product reuses them (stream order keeps them alive).
// Products of up to the reserved size use buffers that never move, so a captured graph may hold their addresses:
// reserve them (outside captures; no graph may hold the old addresses) for the largest captured step. Larger
// products grow a second set outside captures (inside one they fail naming this call).
void reserve_gemm_stage(cudaStream_t s, int64_t rows, int64_t in);

// The stream's buffer of the multi-row products' staging pass (rows_stage.h), under the same rules: reserved
// by reserve_gemm_stage for rows x in (4 bytes an element and one float a 64-wide chunk).
void* rows_stage_buffer(cudaStream_t s, size_t bytes);

#ifdef __CUDACC__
__device__ __forceinline__ float row_scale_of(const RowScales& rs, int src, int r) {
  return __ldg(rs.s + (rs.by_src ? src : r));
}
#endif

}  // namespace lily::cuda
