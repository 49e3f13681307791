// Linear layers: dispatch of decode products to the multi-row product (gemv_rows.cu, 3..32 rows), the GEMV
// (gemv.cu; a scalar fallback here for bf16 rows that are not 16-byte aligned) and of prompt products to the
// tiled GEMMs (tensor cores in gemm_tc.cu, a SIMT kernel here for shapes the tensor-core path does not take;
// the wgmma kernels of gemm_wgmma.cu first on Hopper in the bf16 / fp16 modes, as KernelSwitches::gemm_wgmma asks).
#include <algorithm>

#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/gemm_wgmma.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/rows.h"

namespace lily::cuda {
namespace {

constexpr int kGemvWarps = 8;

// Scalar fallback GEMV for bf16 rows that are not 16-byte aligned (odd shapes only; the fast path is
// gemv.cu): one warp per row, x read from global or, with a fused RMSNorm, from shared memory.
__global__ void __launch_bounds__(32 * kGemvWarps) gemv_scalar_kernel(const Mat W, const int32_t* __restrict__ expert,
    int out, int in, const float* __restrict__ x, int64_t ldx, int xdiv, float* __restrict__ y, int64_t ldy,
    bool accumulate, int swiglu_I, const float* __restrict__ norm_w, float eps) {
  extern __shared__ float xs[];
  __shared__ float red[32];
  const int s = blockIdx.y;
  const int e = expert ? expert[s] : 0;
  const float* xr = x + int64_t(s / xdiv) * ldx;
  if (norm_w) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < in; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss, red) / float(in) + eps);
    for (int i = threadIdx.x; i < in; i += blockDim.x) xs[i] = xr[i] * inv * norm_w[i];
    __syncthreads();
    xr = xs;
  }
  const int nrows = swiglu_I > 0 ? swiglu_I : out;
  const int r = blockIdx.x * kGemvWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= nrows) return;
  auto dot = [&](int64_t row) {
    const uint16_t* w = W.w + int64_t(e) * W.estride + row * W.ld;
    float acc = 0.f;
    for (int i = lane; i < in; i += 32) acc += bf(w[i]) * xr[i];
    return warp_sum(acc);
  };
  const float v = swiglu_I > 0 ? silu(dot(r)) * dot(r + swiglu_I) : dot(r);
  if (lane == 0) {
    float* yp = y + int64_t(s) * ldy + r;
    *yp = accumulate ? *yp + v : v;
  }
}

// 64x64 output tile, 256 threads, each 4x4 outputs strided by 16 (conflict-free shared reads).
constexpr int BK = 16;
__global__ void __launch_bounds__(256) gemm_kernel(const Mat W, int out, int in, const float* __restrict__ x, int64_t ldx,
    const int32_t* __restrict__ gather, float* __restrict__ y, int64_t ldy, bool accumulate,
    const int32_t* __restrict__ tiles, const int32_t* __restrict__ n_tiles, int T) {
  __shared__ float As[BK][kGemmBM + 4];
  __shared__ float Ws_[BK][kGemmBN + 4];
  __shared__ int rows_idx[kGemmBM];
  const int tile = blockIdx.y;
  int e, row0, nrows;
  if (!tile_rows(tiles, n_tiles, tile, T, kGemmBM, e, row0, nrows)) return;
  const int n0 = blockIdx.x * kGemmBN;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  if (tid < kGemmBM) rows_idx[tid] = tid < nrows ? (gather ? gather[row0 + tid] : row0 + tid) : -1;
  __syncthreads();
  float acc[4][4] = {};
  for (int k0 = 0; k0 < in; k0 += BK) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int el = tid + 256 * i, rr = el / BK, kk = el % BK;
      const int xr = rows_idx[rr];
      As[kk][rr] = (xr >= 0 && k0 + kk < in) ? x[int64_t(xr) * ldx + k0 + kk] : 0.f;
      const int n = n0 + rr;
      Ws_[kk][rr] = (n < out && k0 + kk < in) ? mat_at(W, e, n, k0 + kk, in) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { a[i] = As[kk][ty + 16 * i]; b[i] = Ws_[kk][tx + 16 * i]; }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int rr = ty + 16 * i;
    if (rr >= nrows) continue;
    float* yr = y + int64_t(row0 + rr) * ldy;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx + 16 * j;
      if (n < out) yr[n] = accumulate ? yr[n] + acc[i][j] : acc[i][j];
    }
  }
}


void gemm_simt(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
               bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s) {
  dim3 grid(cdiv(out, kGemmBN), max_tiles);
  gemm_kernel<<<grid, 256, 0, s>>>(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, T);
  LILY_CU_LAUNCH();
}

}  // namespace

void gemv_slots(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv, int slots,
                float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w, float eps) {
  if (W.exl3) {
    exl3_gemv_slots(W, expert, out, in, x, ldx, xdiv, slots, y, ldy, accumulate, swiglu_I, s, norm_w, eps);
    return;
  }
  if (slots <= 0) return;
  if (W.affine) {
    if ((W.bits != 4 && W.bits != 8) || in % 32 != 0 || W.gs % 32 != 0 || W.row_words % 4 != 0 || W.qstride % 4 != 0 ||
        !aligned16(W.q))
      fail_internal("affine GEMV: needs bits 4 or 8, in and group size multiples of 32, 16-byte aligned rows");
    // the ring takes plain products of up to kGemvRingMaxRows rows and SwiGLU slots over as many input rows
    if (gemv_ring(W, expert, out, in, x, ldx, xdiv, slots, y, ldy, accumulate, swiglu_I, s, norm_w, eps)) return;
    gemv_fast(W, expert, out, in, x, ldx, xdiv, slots, y, ldy, accumulate, swiglu_I, s, norm_w, eps);
    return;
  }
  if (in % 8 == 0 && W.ld % 8 == 0 && W.estride % 8 == 0 && aligned16(W.w)) {
    gemv_fast(W, expert, out, in, x, ldx, xdiv, slots, y, ldy, accumulate, swiglu_I, s, norm_w, eps);
    return;
  }
  const int nrows = swiglu_I > 0 ? swiglu_I : out;
  const size_t smem = norm_w ? sizeof(float) * size_t(in) : 0;
  gemv_scalar_kernel<<<dim3(cdiv(nrows, kGemvWarps), slots), 32 * kGemvWarps, smem, s>>>(W, expert, out, in, x, ldx, xdiv,
                                                                                        y, ldy, accumulate, swiglu_I, norm_w, eps);
  LILY_CU_LAUNCH();
}

void gemm_tiles(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
                bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s,
                int x_rows) {
  if (W.exl3) {
    exl3_gemm_tiles(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, max_tiles, T, s, x_rows);
    return;
  }
  if (max_tiles <= 0) return;
  const GemmPrec prec = gemm_prec_for(W);
  if (gemm_wgmma_wanted(W) &&
      gemm_wgmma(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, max_tiles, T, prec, s))
    return;  // Hopper wgmma kernel (bf16 / fp16 operands)
  if (gemm_tc(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, max_tiles, T, prec, s, x_rows))
    return;  // tensor cores; the SIMT kernel takes the shapes they cannot
  gemm_simt(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, max_tiles, T, s);
}

void linear_split(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy,
                  cudaStream_t s, const float* norm_w, float eps) {
  if (W.exl3 || T <= std::max(kGemvMaxRows, kernel_switches().gemv_rows)) {
    linear(W, out, in, x, ldx, T, y, ldy, false, s, norm_w, eps);
    return;
  }
  if (norm_w) fail_internal("linear_split: a fused RMSNorm needs the GEMV path (T <= norm_rows)");
  if (out <= 0) return;
  const int mt = int(cdiv(T, kGemmBM));
  if (!gemm_tc(W, out, in, x, ldx, nullptr, y, ldy, false, nullptr, nullptr, mt, T, GemmPrec::kSplit, s))
    gemm_simt(W, out, in, x, ldx, nullptr, y, ldy, false, nullptr, nullptr, mt, T, s);
}

void linear(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy, bool accumulate,
            cudaStream_t s, const float* norm_w, float eps) {
  if (T <= 0 || out <= 0) return;
  if (norm_w && T > norm_fuse_rows()) fail_internal("linear: a fused RMSNorm needs the GEMV path (T <= norm_rows)");
  if (rows_linear(W, out, in, x, ldx, T, y, ldy, accumulate, 0, s, norm_w, eps)) return;  // rows_min..rows_dense rows
  if (T <= std::max(kGemvMaxRows, kernel_switches().gemv_rows))
    gemv_slots(W, nullptr, out, in, x, ldx, 1, T, y, ldy, accumulate, 0, s, norm_w, eps);
  else
    gemm_tiles(W, out, in, x, ldx, nullptr, y, ldy, accumulate, nullptr, nullptr, int(cdiv(T, kGemmBM)), T, s);
}

}  // namespace lily::cuda
