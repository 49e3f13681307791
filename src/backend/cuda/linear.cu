// Dense bf16 linear layers: a row-parallel GEMV for decode and a tiled SIMT GEMM for prompts.
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {

namespace {

constexpr int kGemvWarps = 8;

// Dot of one bf16 weight row with one fp32 input row, by one warp. VEC: 16-byte weight loads
// (in % 8 == 0, rows 16-byte aligned).
template <bool VEC>
__device__ __forceinline__ float warp_dot(const uint16_t* w, const float* x, int in) {
  const int lane = threadIdx.x & 31;
  float acc = 0.f;
  if constexpr (VEC) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int n8 = in >> 3;
#pragma unroll 4
    for (int i = lane; i < n8; i += 32) {
      uint4 wv = __ldg(w4 + i);
      float wf[8];
      bf8(wv, wf);
      float4 a = __ldg(x4 + 2 * i), b = __ldg(x4 + 2 * i + 1);
      acc += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
    }
  } else {
    for (int i = lane; i < in; i += 32) acc += bf(w[i]) * x[i];
  }
  return warp_sum(acc);
}

template <bool VEC>
__global__ void __launch_bounds__(32 * kGemvWarps) gemv_kernel(const uint16_t* __restrict__ W, int64_t ldw,
    int64_t wstride, const int32_t* __restrict__ expert, int out, int in, const float* __restrict__ x, int64_t ldx,
    int xdiv, float* __restrict__ y, int64_t ldy, bool accumulate, int swiglu_I) {
  const int s = blockIdx.y;
  const int r = blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  const int nrows = swiglu_I > 0 ? swiglu_I : out;
  if (r >= nrows) return;
  const uint16_t* Ws = W + (expert ? int64_t(expert[s]) * wstride : 0);
  const float* xs = x + int64_t(s / xdiv) * ldx;
  float v;
  if (swiglu_I > 0) {
    float g = warp_dot<VEC>(Ws + int64_t(r) * ldw, xs, in);
    float u = warp_dot<VEC>(Ws + int64_t(r + swiglu_I) * ldw, xs, in);
    v = silu(g) * u;
  } else {
    v = warp_dot<VEC>(Ws + int64_t(r) * ldw, xs, in);
  }
  if ((threadIdx.x & 31) == 0) {
    float* yp = y + int64_t(s) * ldy + r;
    *yp = accumulate ? *yp + v : v;
  }
}

// 64x64 output tile, 256 threads, each 4x4 outputs strided by 16 (conflict-free shared reads).
constexpr int BK = 16;
__global__ void __launch_bounds__(256) gemm_kernel(const uint16_t* __restrict__ W, int64_t ldw, int64_t wstride,
    int out, int in, const float* __restrict__ x, int64_t ldx, const int32_t* __restrict__ gather,
    float* __restrict__ y, int64_t ldy, bool accumulate, const int32_t* __restrict__ tiles,
    const int32_t* __restrict__ n_tiles, int T) {
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
  const uint16_t* We = W + int64_t(e) * wstride;
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
      Ws_[kk][rr] = (n < out && k0 + kk < in) ? bf(We[int64_t(n) * ldw + k0 + kk]) : 0.f;
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

}  // namespace

void gemv_slots(const uint16_t* W, int64_t ldw, int64_t wstride, const int32_t* expert, int out, int in,
                const float* x, int64_t ldx, int xdiv, int slots, float* y, int64_t ldy, bool accumulate,
                int swiglu_I, cudaStream_t s) {
  if (slots <= 0) return;
  const int nrows = swiglu_I > 0 ? swiglu_I : out;
  dim3 grid(cdiv(nrows, kGemvWarps), slots);
  const bool vec = in % 8 == 0 && ldw % 8 == 0 && wstride % 8 == 0 && ldx % 4 == 0 &&
                   (reinterpret_cast<uintptr_t>(W) & 15) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  if (vec)
    gemv_kernel<true><<<grid, 32 * kGemvWarps, 0, s>>>(W, ldw, wstride, expert, out, in, x, ldx, xdiv, y, ldy, accumulate, swiglu_I);
  else
    gemv_kernel<false><<<grid, 32 * kGemvWarps, 0, s>>>(W, ldw, wstride, expert, out, in, x, ldx, xdiv, y, ldy, accumulate, swiglu_I);
  LILY_CU_LAUNCH();
}

void gemm_tiles(const uint16_t* W, int64_t ldw, int64_t wstride, int out, int in, const float* x, int64_t ldx,
                const int32_t* gather, float* y, int64_t ldy, bool accumulate, const int32_t* tiles,
                const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s) {
  if (max_tiles <= 0) return;
  dim3 grid(cdiv(out, kGemmBN), max_tiles);
  gemm_kernel<<<grid, 256, 0, s>>>(W, ldw, wstride, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, T);
  LILY_CU_LAUNCH();
}

void linear(const uint16_t* W, int64_t ldw, int out, int in, const float* x, int64_t ldx, int T, float* y,
            int64_t ldy, bool accumulate, cudaStream_t s) {
  if (T <= 0 || out <= 0) return;
  if (T <= 2)
    gemv_slots(W, ldw, 0, nullptr, out, in, x, ldx, 1, T, y, ldy, accumulate, 0, s);
  else
    gemm_tiles(W, ldw, 0, out, in, x, ldx, nullptr, y, ldy, accumulate, nullptr, nullptr, int(cdiv(T, kGemmBM)), T, s);
}

}  // namespace lily::cuda
