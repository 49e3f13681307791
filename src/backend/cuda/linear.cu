// Linear layers on bf16 or MLX-affine weights: a row-parallel GEMV for decode (16-byte weight loads,
// affine codes dequantised in registers against an input row staged in shared memory) and a tiled
// SIMT GEMM for prompts (weights dequantised while the tile is staged).
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvRowsPerWarp = 1;  // 4 measured slower (fewer warps, fewer loads in flight)

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Dot of one bf16 weight row with one fp32 input row, by one warp. VEC: 16-byte weight loads
// (in % 8 == 0, rows 16-byte aligned).
template <bool VEC>
__device__ __forceinline__ float warp_dot_bf16(const uint16_t* w, const float* x, int in) {
  const int lane = threadIdx.x & 31;
  float acc = 0.f;
  if constexpr (VEC) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int n8 = in >> 3;
#pragma unroll 4
    for (int i = lane; i < n8; i += 32) {
      uint4 wv = ld_stream(w4 + i);
      float wf[8];
      bf8(wv, wf);
      const float4 a = x4[2 * i], b = x4[2 * i + 1];  // x: global or shared
      acc += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
    }
  } else {
    for (int i = lane; i < in; i += 32) acc += bf(w[i]) * x[i];
  }
  return warp_sum(acc);
}

// Shared-memory layout of the input row for the affine GEMV: lane l's uint4 i = l + 32·it holds codes
// [C·i, C·i + C) (C = 128 / bits); input element e = C·i + j sits at float4 slot
// it·8C + (j/4)·32 + l, so each warp-wide float4 read is 512 contiguous bytes.
template <int BITS>
__device__ __forceinline__ int xs_index(int e) {
  constexpr int C = 128 / BITS;
  const int it = e / (32 * C), l = (e / C) & 31, j = e % C;
  return it * 32 * C + (j >> 2) * 128 + l * 4 + (j & 3);
}

template <int BITS>
__device__ __forceinline__ float warp_dot_affine(const uint32_t* q, const uint16_t* sc, const uint16_t* bi, int gs,
                                                 const float* xs, int in) {
  constexpr int C = 128 / BITS;
  const int lane = threadIdx.x & 31;
  const uint4* q4 = reinterpret_cast<const uint4*>(q);
  const int n = in / C;
  float acc = 0.f;
#pragma unroll 2
  for (int i = lane; i < n; i += 32) {
    const uint4 wv = ld_stream(q4 + i);
    const int g = (i * C) / gs;
    const float s = bf(sc[g]), b = bf(bi[g]);
    const float4* x4 = reinterpret_cast<const float4*>(xs + (i >> 5) * 32 * C) + lane;
    const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
    float qx = 0.f, sx = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (BITS == 4) {
        const float4 xa = x4[(2 * k) * 32], xb = x4[(2 * k + 1) * 32];
        const uint32_t w = words[k];
        qx += float(w & 15u) * xa.x + float((w >> 4) & 15u) * xa.y + float((w >> 8) & 15u) * xa.z +
              float((w >> 12) & 15u) * xa.w + float((w >> 16) & 15u) * xb.x + float((w >> 20) & 15u) * xb.y +
              float((w >> 24) & 15u) * xb.z + float(w >> 28) * xb.w;
        sx += (xa.x + xa.y) + (xa.z + xa.w) + (xb.x + xb.y) + (xb.z + xb.w);
      } else {
        const float4 xa = x4[k * 32];
        const uint32_t w = words[k];
        qx += float(w & 255u) * xa.x + float((w >> 8) & 255u) * xa.y + float((w >> 16) & 255u) * xa.z + float(w >> 24) * xa.w;
        sx += (xa.x + xa.y) + (xa.z + xa.w);
      }
    }
    acc += s * qx + b * sx;
  }
  return warp_sum(acc);
}

// MODE: 0 bf16 16-byte loads, 1 bf16 scalar, 4 / 8 affine bits.
// norm_w: the input row is RMS-normalised (· norm_w) while staged in shared memory (fused RMSNorm).
template <int MODE>
__global__ void __launch_bounds__(32 * kGemvWarps) gemv_kernel(const Mat W, const int32_t* __restrict__ expert, int out,
    int in, const float* __restrict__ x, int64_t ldx, int xdiv, float* __restrict__ y, int64_t ldy, bool accumulate,
    int swiglu_I, const float* __restrict__ norm_w, float eps) {
  extern __shared__ float xs[];
  __shared__ float red[32];
  const int s = blockIdx.y;
  const int e = expert ? expert[s] : 0;
  const float* xr = x + int64_t(s / xdiv) * ldx;
  float inv = 1.f;
  if (norm_w) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < in; i += blockDim.x) ss += xr[i] * xr[i];
    inv = rsqrtf(block_sum(ss, red) / float(in) + eps);
  }
  if constexpr (MODE >= 4) {
    for (int i = threadIdx.x; i < in; i += blockDim.x) xs[xs_index<MODE>(i)] = norm_w ? xr[i] * inv * norm_w[i] : xr[i];
    __syncthreads();
  } else {
    if (norm_w) {
      for (int i = threadIdx.x; i < in; i += blockDim.x) xs[i] = xr[i] * inv * norm_w[i];
      __syncthreads();
      xr = xs;
    }
  }
  const int nrows = swiglu_I > 0 ? swiglu_I : out;
  const int r0 = (blockIdx.x * kGemvWarps + (threadIdx.x >> 5)) * kGemvRowsPerWarp;
  auto dot = [&](int64_t row) -> float {
    if constexpr (MODE == 0 || MODE == 1) {
      return warp_dot_bf16<MODE == 0>(W.w + int64_t(e) * W.estride + row * W.ld, xr, in);
    } else {
      const int64_t gi = int64_t(e) * W.sstride + row * (in / W.gs);
      return warp_dot_affine<MODE>(W.q + int64_t(e) * W.qstride + row * W.row_words, W.s + gi, W.b + gi, W.gs, xs, in);
    }
  };
  for (int r = r0; r < min(nrows, r0 + kGemvRowsPerWarp); ++r) {
    float v;
    if (swiglu_I > 0) {
      const float g = dot(r), u = dot(r + swiglu_I);
      v = silu(g) * u;
    } else {
      v = dot(r);
    }
    if ((threadIdx.x & 31) == 0) {
      float* yp = y + int64_t(s) * ldy + r;
      *yp = accumulate ? *yp + v : v;
    }
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
  int e = 0, row0, nrows;
  if (tiles) {
    if (tile >= *n_tiles) return;
    e = tiles[3 * tile]; row0 = tiles[3 * tile + 1]; nrows = tiles[3 * tile + 2];
  } else {
    row0 = tile * kGemmBM; nrows = min(kGemmBM, T - row0);
  }
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

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

void gemv_slots(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv, int slots,
                float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w, float eps) {
  if (W.exl3) {
    exl3_gemv_slots(W, expert, out, in, x, ldx, xdiv, slots, y, ldy, accumulate, swiglu_I, s, norm_w, eps);
    return;
  }
  if (slots <= 0) return;
  const int nrows = swiglu_I > 0 ? swiglu_I : out;
  dim3 grid(cdiv(nrows, kGemvWarps * kGemvRowsPerWarp), slots);
  const int threads = 32 * kGemvWarps;
  if (W.affine) {
    if ((W.bits != 4 && W.bits != 8) || in % 32 != 0 || W.gs % 32 != 0 || W.row_words % 4 != 0 || W.qstride % 4 != 0 ||
        !aligned16(W.q))
      fail_internal("affine GEMV: needs bits 4 or 8, in and group size multiples of 32, 16-byte aligned rows");
    const int block = 32 * (128 / W.bits);  // the staged row is laid out in blocks of 32 uint4 of codes
    const size_t smem = sizeof(float) * size_t((in + block - 1) / block * block);
    if (W.bits == 4)
      gemv_kernel<4><<<grid, threads, smem, s>>>(W, expert, out, in, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps);
    else
      gemv_kernel<8><<<grid, threads, smem, s>>>(W, expert, out, in, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps);
  } else {
    const bool vec = in % 8 == 0 && W.ld % 8 == 0 && W.estride % 8 == 0 && ldx % 4 == 0 && aligned16(W.w) && aligned16(x);
    const size_t smem = norm_w ? sizeof(float) * size_t(in) : 0;
    if (vec)
      gemv_kernel<0><<<grid, threads, smem, s>>>(W, expert, out, in, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps);
    else
      gemv_kernel<1><<<grid, threads, smem, s>>>(W, expert, out, in, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps);
  }
  LILY_CU_LAUNCH();
}

void gemm_tiles(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
                bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s) {
  if (W.exl3) {
    exl3_gemm_tiles(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, max_tiles, T, s);
    return;
  }
  if (max_tiles <= 0) return;
  if (gemm_tc(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, max_tiles, T, gemm_tc_default_precision(), s))
    return;  // tensor cores; the SIMT kernel below takes the shapes they cannot
  dim3 grid(cdiv(out, kGemmBN), max_tiles);
  gemm_kernel<<<grid, 256, 0, s>>>(W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, T);
  LILY_CU_LAUNCH();
}

void linear(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy, bool accumulate,
            cudaStream_t s, const float* norm_w, float eps) {
  if (T <= 0 || out <= 0) return;
  if (norm_w && T > kGemvMaxRows) fail_internal("linear: a fused RMSNorm needs the GEMV path (T <= 2)");
  if (T <= kGemvMaxRows)
    gemv_slots(W, nullptr, out, in, x, ldx, 1, T, y, ldy, accumulate, 0, s, norm_w, eps);
  else
    gemm_tiles(W, out, in, x, ldx, nullptr, y, ldy, accumulate, nullptr, nullptr, int(cdiv(T, kGemmBM)), T, s);
}

}  // namespace lily::cuda
