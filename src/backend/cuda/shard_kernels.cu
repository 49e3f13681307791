// Kernels of the CUDA ranks (shard_ops.h).
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/shard_ops.h"

namespace lily::cuda {
namespace {

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ p, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += p[i];
}

struct Srcs {
  const float* p[64];
};

__global__ void sum_kernel(float* dst, Srcs src, int nsrc, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
  for (int j = 0; j < nsrc; ++j) acc += src.p[j][i];
  dst[i] = acc;
}

// One warp per token: moe.cu's top-k (topk_warp), then the slots' ids mapped to the rank's stacks.
__global__ void rank_topk_kernel(const float* __restrict__ logits, int ldl, TopkArgs a, int kk, int e0, int E_local) {
  topk_warp(logits + int64_t(blockIdx.x) * ldl, blockIdx.x, a);
  __syncwarp();
  const int lane = threadIdx.x;
  if (lane < kk) {
    int32_t& id = a.idx[int64_t(blockIdx.x) * kk + lane];
    const int e = id;
    id = e == a.E ? E_local : (e >= e0 && e < e0 + E_local) ? e - e0 : -1;
  }
}

// moe.cu's route, over the kept slots only: one block of 1024 threads (En <= 1024).
__global__ void __launch_bounds__(1024) rank_route_kernel(const int32_t* __restrict__ idx, int n, int En, int kk, int tile_rows,
                                                          int32_t* __restrict__ counts, int32_t* __restrict__ slot_pos,
                                                          int32_t* __restrict__ sorted_tok, int32_t* __restrict__ tiles,
                                                          int32_t* __restrict__ n_tiles) {
  extern __shared__ int sh[];  // cnt[En], off[En], fill[En]
  __shared__ int wsum[32][2];
  int* cnt = sh;
  int* off = sh + En;
  int* fill = sh + 2 * En;
  const int tid = threadIdx.x, lane = tid & 31, wi = tid >> 5;
  for (int e = tid; e < En; e += blockDim.x) { cnt[e] = 0; fill[e] = 0; }
  __syncthreads();
  for (int s = tid; s < n; s += blockDim.x)
    if (idx[s] >= 0) atomicAdd(&cnt[idx[s]], 1);
  __syncthreads();
  const int c = tid < En ? cnt[tid] : 0;
  const int nt = (c + tile_rows - 1) / tile_rows;
  int cs = c, ts = nt;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, cs, o), b = __shfl_up_sync(0xffffffffu, ts, o);
    if (lane >= o) { cs += a; ts += b; }
  }
  if (lane == 31) { wsum[wi][0] = cs; wsum[wi][1] = ts; }
  __syncthreads();
  int cb = 0, tb = 0, ctot = 0, ttot = 0;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) {
    if (i < wi) { cb += wsum[i][0]; tb += wsum[i][1]; }
    ctot += wsum[i][0];
    ttot += wsum[i][1];
  }
  if (tid < En) {
    const int o = cb + cs - c, t0 = tb + ts - nt;
    off[tid] = o;
    counts[tid] = c;
    for (int i = 0; i < nt; ++i) {
      tiles[3 * (t0 + i)] = tid;
      tiles[3 * (t0 + i) + 1] = o + i * tile_rows;
      tiles[3 * (t0 + i) + 2] = min(tile_rows, c - i * tile_rows);
    }
  }
  if (tid == 0) {
    counts[En] = ctot;
    *n_tiles = ttot;
  }
  __syncthreads();
  for (int s = tid; s < n; s += blockDim.x) {
    const int e = idx[s];
    if (e < 0) {
      slot_pos[s] = -1;
      continue;
    }
    const int p = off[e] + atomicAdd(&fill[e], 1);
    slot_pos[s] = p;
    sorted_tok[p] = s / kk;
  }
}

__global__ void swiglu_rows_kernel(const float* __restrict__ gu, int I, int64_t rows, float* __restrict__ h) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * I) return;
  const int64_t r = i / I, c = i % I;
  h[i] = silu(gu[r * 2 * I + c]) * gu[r * 2 * I + I + c];
}

// grid (H / 128, T)
__global__ void rank_combine_kernel(float* __restrict__ y, int H, int kk, const float* __restrict__ w,
                                    const int32_t* __restrict__ slot_pos, const float* __restrict__ yb,
                                    const float* __restrict__ ysh, const float* __restrict__ sg, int sg_ld) {
  const int t = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= H) return;
  float acc = 0.f;
  for (int j = 0; j < kk; ++j) {
    const int s = t * kk + j, p = slot_pos[s];
    if (p >= 0) acc += w[s] * yb[int64_t(p) * H + i];
  }
  if (ysh) acc += (sg ? sigmoid(sg[int64_t(t) * sg_ld]) : 1.f) * ysh[int64_t(t) * H + i];
  y[int64_t(t) * H + i] = acc;
}

// a beats b: larger value, or equal and lower id; NaN never wins
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  if (isnan(va)) return false;
  if (isnan(vb)) return true;
  return va > vb || (va == vb && ia < ib);
}

// One block of 256 threads per row.
__global__ void slice_argmax_kernel(const float* __restrict__ logits, int64_t V, int64_t v0, int64_t Vr,
                                    const int32_t* __restrict__ row_index, float* __restrict__ cand, int64_t ld, int64_t c0) {
  const int r = blockIdx.x;
  const float* row = logits + int64_t(row_index ? row_index[r] : r) * V + v0;
  float bv = NAN;
  int bi = 0x7fffffff;
  for (int64_t c = threadIdx.x; c < Vr; c += blockDim.x)
    if (better(row[c], int(v0 + c), bv, bi)) { bv = row[c]; bi = int(v0 + c); }
  __shared__ float sv[256];
  __shared__ int si[256];
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o && better(sv[threadIdx.x + o], si[threadIdx.x + o], sv[threadIdx.x], si[threadIdx.x])) {
      sv[threadIdx.x] = sv[threadIdx.x + o];
      si[threadIdx.x] = si[threadIdx.x + o];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    cand[int64_t(r) * ld + c0] = sv[0];
    cand[int64_t(r) * ld + c0 + 1] = __int_as_float(si[0]);
  }
}

__global__ void pick_argmax_kernel(const float* __restrict__ cand, int64_t ld, int nranks, int S, int32_t* __restrict__ out,
                                   const int32_t* __restrict__ fed_slot, int32_t* __restrict__ fed) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= S) return;
  float bv = NAN;
  int bi = 0x7fffffff;
  for (int q = 0; q < nranks; ++q) {
    const float v = cand[int64_t(r) * ld + 2 * q];
    const int i = __float_as_int(cand[int64_t(r) * ld + 2 * q + 1]);
    if (better(v, i, bv, bi)) { bv = v; bi = i; }
  }
  if (bi == 0x7fffffff) bi = 0;  // every logit NaN: id 0, as argmax() gives
  out[r] = bi;
  if (fed_slot && fed && fed_slot[r] >= 0) fed[fed_slot[r]] = bi;
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void synth_bf16_kernel(uint16_t* w, int64_t rows, int64_t cols, int64_t ld, uint64_t key, float a) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const uint64_t h = mix64(key + uint64_t(i) * 0x9E3779B97F4A7C15ull);
    const float u = float(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
    w[r * ld + c] = uint16_t(__float_as_uint(a * u) >> 16);
  }
}

__global__ void synth_words_kernel(uint32_t* w, size_t n, uint64_t key) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    w[i] = uint32_t(mix64(key + uint64_t(i) * 0x9E3779B97F4A7C15ull) >> 16);
}

__global__ void synth_fill16_kernel(uint16_t* w, size_t n, uint16_t v) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) w[i] = v;
}

__global__ void synth_signs16_kernel(uint16_t* w, size_t n, uint64_t key, uint16_t pos, uint16_t neg) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    w[i] = (mix64(key + uint64_t(i) * 0x9E3779B97F4A7C15ull) >> 63) ? neg : pos;
}

unsigned grid_for(size_t n) { return unsigned(std::min<size_t>((n + 255) / 256, 65535)); }

}  // namespace

void add_into(float* x, const float* p, size_t n, cudaStream_t s) {
  if (n == 0) return;
  add_kernel<<<cdiv(int64_t(n), 256), 256, 0, s>>>(x, p, n);
  LILY_CU_LAUNCH();
}

void sum_buffers(float* dst, const float* const* src, int nsrc, size_t n, cudaStream_t s) {
  if (n == 0) return;
  if (nsrc < 1 || nsrc > 64) fail_internal("sum_buffers: 1..64 sources");
  Srcs a{};
  for (int j = 0; j < nsrc; ++j) a.p[j] = src[j];
  sum_kernel<<<cdiv(int64_t(n), 256), 256, 0, s>>>(dst, a, nsrc, n);
  LILY_CU_LAUNCH();
}

RankMoeScratch rank_moe_layout(void* base, int T, int kk, int E_global, int E_local, int I, int Is, int H, int tile_rows) {
  RankMoeScratch r{};
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) { char* q = p ? p + off : nullptr; off += (bytes + 255) & ~size_t(255); return q; };
  const size_t n = size_t(T) * size_t(kk);
  const int En = E_local + 1;
  const size_t max_tiles = (n + size_t(tile_rows) - 1) / size_t(tile_rows) + size_t(En);
  r.logits = reinterpret_cast<float*>(take(4 * size_t(T) * size_t(E_global + 1)));
  r.w = reinterpret_cast<float*>(take(4 * n));
  r.idx = reinterpret_cast<int32_t*>(take(4 * n));
  r.slot_pos = reinterpret_cast<int32_t*>(take(4 * n));
  r.sorted_tok = reinterpret_cast<int32_t*>(take(4 * n));
  r.tiles = reinterpret_cast<int32_t*>(take(4 * 3 * max_tiles));
  r.n_tiles = reinterpret_cast<int32_t*>(take(4));
  r.counts = reinterpret_cast<int32_t*>(take(4 * size_t(En + 1)));
  r.gu = reinterpret_cast<float*>(take(4 * n * 2 * size_t(I)));
  r.h = reinterpret_cast<float*>(take(4 * n * size_t(I)));
  r.yb = reinterpret_cast<float*>(take(4 * n * size_t(H)));
  r.sh_gu = reinterpret_cast<float*>(take(4 * size_t(T) * 2 * size_t(Is)));
  r.sh_h = reinterpret_cast<float*>(take(4 * size_t(T) * size_t(Is)));
  r.ysh = reinterpret_cast<float*>(take(4 * size_t(T) * size_t(H)));
  r.sg = reinterpret_cast<float*>(take(4 * size_t(T)));
  r.bytes = off;
  return r;
}

void rank_topk(const float* logits, int ldl, int T, int E_global, int k, bool norm_topk, bool shared, bool shared_gated,
               int e0, int E_local, int32_t* idx, float* w, cudaStream_t s) {
  if (E_global > 32 * kTopkMaxPerLane || k + (shared ? 1 : 0) > 32)
    fail_internal("rank_topk: at most 512 experts and 32 slots per token on CUDA");
  TopkArgs a;
  a.E = E_global; a.k = k; a.norm_topk = norm_topk; a.shared = shared; a.shared_gated = shared_gated;
  a.idx = idx; a.w = w;
  rank_topk_kernel<<<T, 32, 0, s>>>(logits, ldl, a, k + (shared ? 1 : 0), e0, E_local);
  LILY_CU_LAUNCH();
}

void rank_route(const int32_t* idx, int n, int En, int kk, int tile_rows, int32_t* counts, int32_t* slot_pos,
                int32_t* sorted_tok, int32_t* tiles, int32_t* n_tiles, cudaStream_t s) {
  if (En > 1024) fail_internal("rank_route: at most 1024 experts in a rank's stacks");
  rank_route_kernel<<<1, 1024, sizeof(int) * 3 * size_t(En), s>>>(idx, n, En, kk, tile_rows, counts, slot_pos, sorted_tok,
                                                                  tiles, n_tiles);
  LILY_CU_LAUNCH();
}

void swiglu_rows(const float* gu, int I, int64_t rows, float* h, cudaStream_t s) {
  if (rows * I == 0) return;
  swiglu_rows_kernel<<<cdiv(rows * I, 256), 256, 0, s>>>(gu, I, rows, h);
  LILY_CU_LAUNCH();
}

void rank_combine(float* y, int T, int H, int kk, const float* w, const int32_t* slot_pos, const float* yb, const float* ysh,
                  const float* sg, int sg_ld, cudaStream_t s) {
  rank_combine_kernel<<<dim3(cdiv(H, 128), T), 128, 0, s>>>(y, H, kk, w, slot_pos, yb, ysh, sg, sg_ld);
  LILY_CU_LAUNCH();
}

void slice_argmax(const float* logits, int64_t V, int64_t v0, int64_t Vr, const int32_t* row_index, int S, float* cand,
                  int64_t ld, int64_t c0, cudaStream_t s) {
  if (S <= 0) return;
  slice_argmax_kernel<<<S, 256, 0, s>>>(logits, V, v0, Vr, row_index, cand, ld, c0);
  LILY_CU_LAUNCH();
}

void pick_argmax(const float* cand, int64_t ld, int nranks, int S, int32_t* out, const int32_t* fed_slot, int32_t* fed,
                 cudaStream_t s) {
  if (S <= 0) return;
  pick_argmax_kernel<<<cdiv(S, 128), 128, 0, s>>>(cand, ld, nranks, S, out, fed_slot, fed);
  LILY_CU_LAUNCH();
}

void synth_bf16(uint16_t* w, int64_t rows, int64_t cols, int64_t ld, uint64_t key, float a, cudaStream_t s) {
  if (rows * cols == 0) return;
  synth_bf16_kernel<<<grid_for(size_t(rows * cols)), 256, 0, s>>>(w, rows, cols, ld, key, a);
  LILY_CU_LAUNCH();
}

void synth_words(uint32_t* w, size_t n, uint64_t key, cudaStream_t s) {
  if (n == 0) return;
  synth_words_kernel<<<grid_for(n), 256, 0, s>>>(w, n, key);
  LILY_CU_LAUNCH();
}

void synth_fill16(uint16_t* w, size_t n, uint16_t v, cudaStream_t s) {
  if (n == 0) return;
  synth_fill16_kernel<<<grid_for(n), 256, 0, s>>>(w, n, v);
  LILY_CU_LAUNCH();
}

void synth_signs16(uint16_t* w, size_t n, uint64_t key, uint16_t pos, uint16_t neg, cudaStream_t s) {
  if (n == 0) return;
  synth_signs16_kernel<<<grid_for(n), 256, 0, s>>>(w, n, key, pos, neg);
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
