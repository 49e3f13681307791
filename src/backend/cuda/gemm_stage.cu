// Input staging of the prompt GEMMs (gemm_stage.h): one warp per row; the fp16 rule of backend/fp16_scale.h
// on max |x| over the row (fmaxf: NaN elements do not count, the row keeps them).
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/gemm_stage.h"
#include "backend/cuda/gemm_wgmma_rs.h"
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float row_scale_value(const float* __restrict__ xr, int in, int lane) {
  float m = 0.f;
  for (int k = lane; k < in; k += 32) m = fmaxf(m, fabsf(__ldg(xr + k)));
  return pow2f(fp16_row_exponent(warp_max(m)));
}

// Rows 0..n-1 of x.
__global__ void __launch_bounds__(32 * kWarps) scale_rows_kernel(const float* __restrict__ x, int64_t ldx, int in,
                                                                 int n, float* __restrict__ out) {
  const int r = int(blockIdx.x) * kWarps + int(threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (r >= n) return;
  const float v = row_scale_value(x + int64_t(r) * ldx, in, lane);
  if (lane == 0) out[r] = v;
}

// Product rows of live tile blockIdx.x: out[r] for r in [row0, row0 + nrows), reading x row gather[r] (or r).
__global__ void __launch_bounds__(32 * kWarps) scale_tiles_kernel(const float* __restrict__ x, int64_t ldx, int in,
    const int32_t* __restrict__ gather, const int32_t* __restrict__ tiles, const int32_t* __restrict__ n_tiles,
    float* __restrict__ out) {
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int row0 = tiles[3 * tile + 1], nrows = min(tiles[3 * tile + 2], kGemmUnitRows);
  const int lane = threadIdx.x & 31;
  for (int j = int(threadIdx.x >> 5); j < nrows; j += kWarps) {
    const int r = row0 + j;
    const float v = row_scale_value(x + int64_t(gather ? gather[r] : r) * ldx, in, lane);
    if (lane == 0) out[r] = v;
  }
}

__device__ __forceinline__ uint32_t pack16x2(bool fp16, float lo, float hi) {
  if (fp16) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Product row r (reading x row src) into a[r]: 16-bit, fp16 scaled (s[r]). in % 4 == 0, rows 16-byte aligned.
// P: the column permutation of gemm_wgmma_rs.h (0: none).
template <bool F16, int P>
__device__ __forceinline__ void stage_row(const float* __restrict__ xr, int in, uint16_t* __restrict__ ar,
                                          float* __restrict__ s, int r, int lane) {
  const float4* x4 = reinterpret_cast<const float4*>(xr);
  float sc = 1.f;
  if constexpr (F16) {
    float m = 0.f;
    for (int k = lane; k < in / 4; k += 32) {
      const float4 v = __ldg(x4 + k);
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    sc = pow2f(fp16_row_exponent(warp_max(m)));
    if (lane == 0) s[r] = sc;
  }
  if constexpr (P == 0) {
    for (int k = lane; k < in / 4; k += 32) {
      const float4 v = __ldg(x4 + k);
      reinterpret_cast<uint2*>(ar)[k] = make_uint2(pack16x2(F16, v.x * sc, v.y * sc), pack16x2(F16, v.z * sc, v.w * sc));
    }
  } else {
    const int ld = (in + 63) / 64 * 64;
    for (int k = 2 * lane; k < ld; k += 64) {  // a warp per 64-column block: logical pairs (k, k + 1)
      const int blk = k & ~63, p0 = blk + rs_phys_k(P, k & 63), p1 = blk + rs_phys_k(P, (k & 63) + 1);
      const float v0 = p0 < in ? __ldg(xr + p0) : 0.f, v1 = p1 < in ? __ldg(xr + p1) : 0.f;
      reinterpret_cast<uint32_t*>(ar)[k >> 1] = pack16x2(F16, v0 * sc, v1 * sc);
    }
  }
}

template <bool F16, int P>
__global__ void __launch_bounds__(32 * kWarps) stage_dense_kernel(const float* __restrict__ x, int64_t ldx, int in,
                                                                  int T, uint16_t* __restrict__ a, int64_t lda,
                                                                  float* __restrict__ s) {
  const int r = int(blockIdx.x) * kWarps + int(threadIdx.x >> 5);
  if (r >= T) return;
  stage_row<F16, P>(x + int64_t(r) * ldx, in, a + int64_t(r) * lda, s, r, threadIdx.x & 31);
}

template <bool F16, int P>
__global__ void __launch_bounds__(32 * kWarps) stage_tiles_kernel(const float* __restrict__ x, int64_t ldx, int in,
    const int32_t* __restrict__ gather, const int32_t* __restrict__ tiles, const int32_t* __restrict__ n_tiles,
    uint16_t* __restrict__ a, int64_t lda, float* __restrict__ s) {
  const int tile = blockIdx.x;
  if (tile >= *n_tiles) return;
  const int row0 = tiles[3 * tile + 1], nrows = min(tiles[3 * tile + 2], kGemmUnitRows);
  for (int j = int(threadIdx.x >> 5); j < nrows; j += kWarps) {
    const int r = row0 + j;
    stage_row<F16, P>(x + int64_t(gather ? gather[r] : r) * ldx, in, a + int64_t(r) * lda, s, r, threadIdx.x & 31);
  }
}

template <bool F16, int P>
void launch_stage(const float* x, int64_t ldx, int in, const int32_t* gather, const int32_t* tiles,
                  const int32_t* n_tiles, int max_tiles, int T, uint16_t* a, int64_t lda, float* sc, cudaStream_t s) {
  if (tiles)
    stage_tiles_kernel<F16, P><<<unsigned(max_tiles), 32 * kWarps, 0, s>>>(x, ldx, in, gather, tiles, n_tiles, a, lda, sc);
  else
    stage_dense_kernel<F16, P><<<cdiv(T, kWarps), 32 * kWarps, 0, s>>>(x, ldx, in, T, a, lda, sc);
}

template <bool F16>
void launch_stage_perm(int perm_bits, const float* x, int64_t ldx, int in, const int32_t* gather, const int32_t* tiles,
                       const int32_t* n_tiles, int max_tiles, int T, uint16_t* a, int64_t lda, float* sc, cudaStream_t s) {
  switch (perm_bits) {
    case 0: launch_stage<F16, 0>(x, ldx, in, gather, tiles, n_tiles, max_tiles, T, a, lda, sc, s); return;
    case 4: launch_stage<F16, 4>(x, ldx, in, gather, tiles, n_tiles, max_tiles, T, a, lda, sc, s); return;
    case 8: launch_stage<F16, 8>(x, ldx, in, gather, tiles, n_tiles, max_tiles, T, a, lda, sc, s); return;
    case 16: launch_stage<F16, 16>(x, ldx, in, gather, tiles, n_tiles, max_tiles, T, a, lda, sc, s); return;
    default: fail_internal("stage_rows: perm_bits must be 0, 4, 8 or 16");
  }
}

// ---- buffers per (device, stream, slot): `fixed` (reserved, never moves) and `grown` (larger products) ----
enum Slot { kScales = 0, kStageScales = 1, kStage = 2, kRowsStage = 3, kSlots = 4 };
struct Buf {
  void* p = nullptr;
  size_t cap = 0;
};
struct Entry {
  Buf fixed[kSlots], grown[kSlots];
};
struct Registry {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, Entry> live;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: streams may outlive static destruction order
  return *r;
}

Entry& entry(cudaStream_t s) {
  int dev = 0;
  LILY_CU(cudaGetDevice(&dev));
  return registry().live[{dev, s}];
}

void regrow(Buf& b, size_t bytes) {
  if (b.p) LILY_CU(cudaFree(b.p));  // synchronous: no queued kernel still reads it
  b.p = nullptr;
  b.cap = 0;
  LILY_CU(cudaMalloc(&b.p, bytes));
  b.cap = bytes;
}

void* buffer(cudaStream_t s, Slot slot, size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  std::lock_guard<std::mutex> lock(registry().mu);
  Entry& e = entry(s);
  if (e.fixed[slot].cap >= bytes) return e.fixed[slot].p;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  LILY_CU(cudaStreamIsCapturing(s, &st));
  if (st != cudaStreamCaptureStatusNone)  // a graph must not hold a buffer that may move
    fail_internal("GEMM input staging: the stream's buffers are too small inside a capture (reserve_gemm_stage first)");
  Buf& g = e.grown[slot];
  if (g.cap >= bytes) return g.p;
  regrow(g, std::max(bytes, g.cap + g.cap / 2));
  return g.p;
}

}  // namespace

void reserve_gemm_stage(cudaStream_t s, int64_t rows, int64_t in) {
  rows = std::max<int64_t>(rows, 1);
  const size_t in64 = size_t((in + 63) / 64 * 64);
  const size_t sizes[kSlots] = {4 * size_t(rows), 4 * size_t(rows), 2 * size_t(rows) * in64,
                                4 * size_t(rows) * (in64 + in64 / 64)};
  std::lock_guard<std::mutex> lock(registry().mu);
  Entry& e = entry(s);
  for (int i = 0; i < kSlots; ++i)
    if (e.fixed[i].cap < sizes[i]) regrow(e.fixed[i], sizes[i]);
}

void* rows_stage_buffer(cudaStream_t s, size_t bytes) { return buffer(s, kRowsStage, bytes); }

RowScales row_scales(const float* x, int64_t ldx, int in, const int32_t* gather, const int32_t* tiles,
                     const int32_t* n_tiles, int max_tiles, int T, int x_rows, cudaStream_t s) {
  RowScales rs;
  rs.by_src = x_rows > 0 || !tiles;
  const int n = x_rows > 0 ? x_rows : T;
  float* out = static_cast<float*>(buffer(s, kScales, 4 * size_t(std::max(n, 1))));
  rs.s = out;
  if (n <= 0 || (tiles && max_tiles <= 0 && x_rows <= 0)) return rs;
  if (rs.by_src)
    scale_rows_kernel<<<cdiv(n, kWarps), 32 * kWarps, 0, s>>>(x, ldx, in, n, out);
  else
    scale_tiles_kernel<<<unsigned(max_tiles), 32 * kWarps, 0, s>>>(x, ldx, in, gather, tiles, n_tiles, out);
  LILY_CU_LAUNCH();
  return rs;
}

StagedRows stage_rows(bool fp16, const float* x, int64_t ldx, int in, const int32_t* gather, const int32_t* tiles,
                      const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s, int perm_bits) {
  if (in % 4 != 0 || ldx % 4 != 0 || !aligned16(x)) fail_internal("stage_rows: needs in and ldx multiples of 4, x 16-byte aligned");
  StagedRows st;
  st.ld = perm_bits ? (in + 63) / 64 * 64 : (in + 7) / 8 * 8;
  const int rows = std::max(T, 1);
  auto* a = static_cast<uint16_t*>(buffer(s, kStage, 2 * size_t(rows) * size_t(st.ld)));
  float* sc = fp16 ? static_cast<float*>(buffer(s, kStageScales, 4 * size_t(rows))) : nullptr;
  st.a = a;
  st.s = sc;
  if (T <= 0 || (tiles && max_tiles <= 0)) return st;
  if (fp16) launch_stage_perm<true>(perm_bits, x, ldx, in, gather, tiles, n_tiles, max_tiles, T, a, st.ld, sc, s);
  else launch_stage_perm<false>(perm_bits, x, ldx, in, gather, tiles, n_tiles, max_tiles, T, a, st.ld, sc, s);
  LILY_CU_LAUNCH();
  return st;
}

}  // namespace lily::cuda
