// Per-row power-of-two scales of the fp16-operand prompt GEMMs (GemmPrec::kFp16; the rule in
// backend/fp16_scale.h): a pre-pass over the input rows a product reads, into a buffer of the stream.
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
// product rows the tile map's live tiles name (rows below T), or of dense rows 0..T-1. The buffer belongs
// to stream s (reused by its next product, so stream order keeps it alive) and grows outside stream
// captures only: reserve it first for steps that are captured.
RowScales row_scales(const float* x, int64_t ldx, int in, const int32_t* gather, const int32_t* tiles,
                     const int32_t* n_tiles, int max_tiles, int T, int x_rows, cudaStream_t s);
void reserve_row_scales(cudaStream_t s, int64_t rows);

#ifdef __CUDACC__
__device__ __forceinline__ float row_scale_of(const RowScales& rs, int src, int r) {
  return __ldg(rs.s + (rs.by_src ? src : r));
}
#endif

}  // namespace lily::cuda
