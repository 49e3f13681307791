// Hopper GEMM with the weights dequantised in the consumers' registers (gemm_wgmma_rs.cu): wgmma with A, the
// weights, from registers (64 output columns × 16 k per instruction) and B, the staged input rows, from shared
// memory; for MLX affine 4/8-bit weights in both operand types and bf16 weights in fp16 (converted in
// registers). Called through gemm_wgmma (gemm_wgmma.h), same contract.
//
// The k order inside each 64-deep stage is permuted so that each thread's A fragments come from one contiguous
// run of its weight row: thread c (= lane % 4) of a warp owns physical k 16c .. 16c + 15 of the stage, which
// hold its fragments' logical k {2c, 2c + 1, 2c + 8, 2c + 9} + 16s of the four k16 slices s (the wgmma's k).
// The input rows are staged in the logical order (gemm_stage.h, perm_bits), so Σ_k x_k · w_k is unchanged.
// The layout functions below are plain C++ (tests check them on the host).
#pragma once
#include <cstdint>

#include "backend/cuda/ops.h"
#include "backend/cuda/switches.h"

#if defined(__CUDACC__)
#define LILY_RS_HD __host__ __device__ __forceinline__
#else
#define LILY_RS_HD inline
#endif

namespace lily::cuda {

// Physical k (0..63, the column of the weight codes and of the input within the stage) of logical k kl (0..63)
// for codes of `bits` (4, 8; 16: bf16 weights). kl = 16s + 2c + v0 + 8v2 (slice s, thread c, pair element v0,
// fragment half v2).
LILY_RS_HD int rs_phys_k(int bits, int kl) {
  const int s = kl >> 4, c = (kl >> 1) & 3, v0 = kl & 1, v2 = (kl >> 3) & 1;
  if (bits == 4) return 16 * c + 8 * (s >> 1) + 2 * (s & 1) + v2 + 4 * v0;
  if (bits == 8) return 16 * c + 4 * s + v2 + 2 * v0;
  return 16 * c + 4 * s + 2 * v2 + v0;
}

// The two codes of logical (s, v2, v0 = 0 | 1) as the low and high 16-bit halves of a word, from thread c's
// words w of one weight row in the stage (physical k 16c.. 16c + 15: 2 words of 4-bit codes, 4 of 8-bit, 8 of
// bf16 pairs); each half holds the code in its low bits (bf16: the value).
LILY_RS_HD uint32_t rs_code_pair(int bits, const uint32_t* w, int s, int v2) {
  if (bits == 4) return (w[s >> 1] >> (4 * (2 * (s & 1) + v2))) & 0x000F000Fu;
  if (bits == 8) return (w[s] >> (8 * v2)) & 0x00FF00FFu;
  return w[2 * s + v2];
}

// Words of one weight row per 64-deep stage.
LILY_RS_HD int rs_row_words(int bits) { return bits * 64 / 32; }

// Whether the register-A kernel runs W in precision prec (affine 4/8-bit in bf16 or fp16; bf16 weights in fp16).
inline bool gemm_wgmma_rs_covers(const Mat& W, GemmPrec prec) {
  return prec != GemmPrec::kSplit && (W.affine || prec == GemmPrec::kFp16);
}

// The launcher (gemm_wgmma's checks done: device, shape, alignment); x staged in rs_phys_k order by the callee.
void gemm_wgmma_rs(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y,
                   int64_t ldy, bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T,
                   GemmPrec prec, int sms, cudaStream_t s);
void init_gemm_wgmma_rs_kernels();

}  // namespace lily::cuda
