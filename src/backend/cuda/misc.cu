// Small row-wise kernels: RMSNorm, embedding gather, argmax, position counter.
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

__global__ void rmsnorm_kernel(const float* __restrict__ x, int64_t ldx, const float* __restrict__ w, int H, float eps,
                               float* __restrict__ y, int64_t ldy) {
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * ldx;
  float* yr = y + int64_t(blockIdx.x) * ldy;
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / float(H) + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}

// One warp per row, the row held in registers (NV float4 per lane, H = 128·NV): one read of x, no block
// barrier; 8 rows per block.
template <int NV>
__global__ void __launch_bounds__(256) rmsnorm_warp_kernel(const float* __restrict__ x, int64_t ldx,
    const float* __restrict__ w, int T, float eps, float* __restrict__ y, int64_t ldy) {
  const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= T) return;
  const float4* xr = reinterpret_cast<const float4*>(x + int64_t(row) * ldx);
  float4 v[NV];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    v[k] = __ldg(xr + lane + 32 * k);
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  const float inv = rsqrtf(warp_sum(ss) / float(128 * NV) + eps);
  float4* yr = reinterpret_cast<float4*>(y + int64_t(row) * ldy);
  const float4* w4 = reinterpret_cast<const float4*>(w);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const float4 g = __ldg(w4 + lane + 32 * k);
    yr[lane + 32 * k] = make_float4(v[k].x * inv * g.x, v[k].y * inv * g.y, v[k].z * inv * g.z, v[k].w * inv * g.w);
  }
}

__global__ void embed_kernel(const Mat table, int H, const int32_t* __restrict__ tokens,
                             const int32_t* __restrict__ row_group, const DevGroup* __restrict__ groups,
                             const int32_t* __restrict__ fed, float* __restrict__ x) {
  pdl_entry();
  int64_t r = tokens[blockIdx.x];
  if (r < 0 && fed) r = fed[groups[row_group[blockIdx.x]].slot];
  float* xr = x + int64_t(blockIdx.x) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = mat_at(table, 0, r, i, H);
}

// Order-preserving 64-bit key of (logit, index): larger logits win, then lower indices (ties keep the
// lowest, as the host argmax); NaN never wins; 0 means "no candidate".
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  if (v != v) return 0ull;
  uint32_t b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(b) << 32) | uint32_t(~uint32_t(i));
}

__device__ __forceinline__ unsigned long long block_max_key(unsigned long long k, unsigned long long* red) {
  for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, o));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) red[w] = k;
  __syncthreads();
  k = lane < int(blockDim.x >> 5) ? red[lane] : 0ull;
  for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, o));
  return k;  // valid in warp 0
}

// grid (B, rows): block b of row r reduces the slice [b·per, (b+1)·per) to a key and folds it into
// keys[r] with atomicMax; the row's last block (counts[r]) writes out[r] and zeroes keys[r] and
// counts[r] for the next call. One row of 248K logits is ~1 MB: read by one block it costs ~48 µs
// on an H200, by a grid of 122 blocks ~7 µs.
__global__ void argmax_kernel(const float* __restrict__ logits, int V, int per, int32_t* __restrict__ out,
                              unsigned long long* __restrict__ keys, unsigned* __restrict__ counts,
                              const int32_t* __restrict__ row_index, const int32_t* __restrict__ fed_slot,
                              int32_t* __restrict__ fed) {
  __shared__ unsigned long long red[32];
  __shared__ bool last;
  allow_dependent_launch();
  grid_dependency_wait();
  const int row = blockIdx.y;
  const float* l = logits + int64_t(row_index ? row_index[row] : row) * V;
  const int b0 = blockIdx.x * per, b1 = min(V, b0 + per);
  unsigned long long best = 0ull;
#pragma unroll 8
  for (int i = b0 + threadIdx.x; i < b1; i += blockDim.x) best = max(best, argmax_key(l[i], i));
  best = block_max_key(best, red);
  if (threadIdx.x == 0) {
    if (best) atomicMax(keys + row, best);
    __threadfence();
    last = atomicAdd(counts + row, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    const unsigned long long k = atomicExch(keys + row, 0ull);
    counts[row] = 0u;
    const int32_t id = k ? int32_t(~uint32_t(k & 0xffffffffu)) : 0;
    out[row] = id;
    if (fed_slot && fed && fed_slot[row] >= 0) fed[fed_slot[row]] = id;
  }
}

__global__ void gather_kernel(const float* __restrict__ x, int64_t ldx, const int32_t* __restrict__ rows, int H,
                              float* __restrict__ y, int64_t ldy) {
  pdl_entry();
  const float* xr = x + int64_t(rows[blockIdx.x]) * ldx;
  float* yr = y + int64_t(blockIdx.x) * ldy;
  for (int i = threadIdx.x; i < H; i += blockDim.x) yr[i] = xr[i];
}

__global__ void fill_cols_kernel(float* __restrict__ y, int64_t ld, int c0, int c1, float v) {
  pdl_entry();
  float* r = y + int64_t(blockIdx.y) * ld;
  for (int c = c0 + int(blockIdx.x * blockDim.x + threadIdx.x); c < c1; c += int(gridDim.x * blockDim.x)) r[c] = v;
}

__global__ void advance_kernel(int64_t* pos, int T) {
  pdl_entry();
  *pos += T;
}

}  // namespace

void init_attn_kernels();
void init_gdn_kernels();
void init_gemm_tc_kernels();
void init_exl3_kernels();
void init_gemm_wgmma_kernels();

void init_kernels() {
  init_attn_kernels();
  init_gdn_kernels();
  init_gemm_tc_kernels();
  init_exl3_kernels();
  init_gemm_wgmma_kernels();
  init_gemv_kernels();
}

void rmsnorm(const float* x, int64_t ldx, const float* w, int T, int H, float eps, float* y, int64_t ldy, cudaStream_t s) {
  if (T <= 0) return;
  const bool vec = H % 128 == 0 && H <= 128 * 16 && ldx % 4 == 0 && ldy % 4 == 0 && aligned16(x) && aligned16(y) &&
                   aligned16(w);
  if (vec) {
    const unsigned blocks = cdiv(T, 8);
    switch (H / 128) {
#define LILY_RMS(N) case N: rmsnorm_warp_kernel<N><<<blocks, 256, 0, s>>>(x, ldx, w, T, eps, y, ldy); break
      LILY_RMS(1); LILY_RMS(2); LILY_RMS(3); LILY_RMS(4); LILY_RMS(5); LILY_RMS(6); LILY_RMS(7); LILY_RMS(8);
      LILY_RMS(9); LILY_RMS(10); LILY_RMS(11); LILY_RMS(12); LILY_RMS(13); LILY_RMS(14); LILY_RMS(15); LILY_RMS(16);
#undef LILY_RMS
    }
  } else {
    rmsnorm_kernel<<<T, 1024, 0, s>>>(x, ldx, w, H, eps, y, ldy);  // wide blocks: few dependent loads per thread
  }
  LILY_CU_LAUNCH();
}

void embed(const Mat& table, int H, const int32_t* tokens, int T, float* x, cudaStream_t s, const int32_t* row_group,
           const DevGroup* groups, const int32_t* fed) {
  if (T <= 0) return;
  if (fed && (!row_group || !groups)) fail_internal("embed: fed tokens need the step's row groups");
  launch_pdl(embed_kernel, dim3(T), dim3(256), 0, s, table, H, tokens, row_group, groups, fed, x);
  LILY_CU_LAUNCH();
}

size_t argmax_scratch_bytes(int rows) { return size_t(rows) * (sizeof(unsigned long long) + sizeof(unsigned)); }

void argmax(const float* logits, int rows, int V, int32_t* out, void* scratch, cudaStream_t s, const int32_t* row_index,
            const int32_t* fed_slot, int32_t* fed) {
  if (rows <= 0) return;
  if (V <= 0) fail_internal("argmax: empty rows");
  auto* keys = static_cast<unsigned long long*>(scratch);
  auto* counts = reinterpret_cast<unsigned*>(keys + rows);
  constexpr int kPer = 2048;  // logits per block (8 per thread)
  const int B = int(std::min<int64_t>(cdiv(V, kPer), 1024));
  const int per = int(cdiv(V, B));
  launch_pdl(argmax_kernel, dim3(unsigned(B), unsigned(rows)), dim3(256), 0, s, logits, V, per, out, keys, counts, row_index,
             fed_slot, fed);
  LILY_CU_LAUNCH();
}

void gather_rows(const float* x, int64_t ldx, const int32_t* rows, int n, int H, float* y, int64_t ldy, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(gather_kernel, dim3(unsigned(n)), dim3(256), 0, s, x, ldx, rows, H, y, ldy);
  LILY_CU_LAUNCH();
}

void fill_cols(float* y, int64_t ld, int rows, int c0, int c1, float v, cudaStream_t s) {
  if (rows <= 0 || c1 <= c0) return;
  launch_pdl(fill_cols_kernel, dim3(std::min(cdiv(c1 - c0, 256), 256u), unsigned(rows)), dim3(256), 0, s, y, ld, c0, c1, v);
  LILY_CU_LAUNCH();
}

void advance_pos(int64_t* pos, int T, cudaStream_t s) {
  launch_pdl(advance_kernel, dim3(1), dim3(1), 0, s, pos, T);
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
