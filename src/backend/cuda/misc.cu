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

__global__ void embed_kernel(const Mat table, int H, const int32_t* __restrict__ tokens, float* __restrict__ x) {
  pdl_entry();
  const int64_t r = tokens[blockIdx.x];
  float* xr = x + int64_t(blockIdx.x) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) xr[i] = mat_at(table, 0, r, i, H);
}

__global__ void argmax_kernel(const float* __restrict__ logits, int V, int32_t* __restrict__ out) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  pdl_entry();
  const float* l = logits + int64_t(blockIdx.x) * V;
  float best = -INFINITY;
  int idx = 0x7fffffff;
#pragma unroll 8
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = l[i];
    if (v > best) { best = v; idx = i; }  // per thread: increasing i, so ties keep the lowest
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) { bv[w] = best; bi[w] = idx; }
  __syncthreads();
  if (w == 0) {
    const int nw = blockDim.x >> 5;
    best = lane < nw ? bv[lane] : -INFINITY;
    idx = lane < nw ? bi[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    if (lane == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
  }
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

void init_kernels() {
  init_attn_kernels();
  init_gdn_kernels();
  init_gemm_tc_kernels();
  init_exl3_kernels();
  init_gemv_kernels();
}

void rmsnorm(const float* x, int64_t ldx, const float* w, int T, int H, float eps, float* y, int64_t ldy, cudaStream_t s) {
  if (T <= 0) return;
  rmsnorm_kernel<<<T, 1024, 0, s>>>(x, ldx, w, H, eps, y, ldy);  // wide blocks: few dependent loads per thread
  LILY_CU_LAUNCH();
}

void embed(const Mat& table, int H, const int32_t* tokens, int T, float* x, cudaStream_t s) {
  if (T <= 0) return;
  launch_pdl(embed_kernel, dim3(T), dim3(256), 0, s, table, H, tokens, x);
  LILY_CU_LAUNCH();
}

void argmax(const float* logits, int rows, int V, int32_t* out, cudaStream_t s) {
  if (rows <= 0) return;
  launch_pdl(argmax_kernel, dim3(rows), dim3(1024), 0, s, logits, V, out);
  LILY_CU_LAUNCH();
}

void advance_pos(int64_t* pos, int T, cudaStream_t s) {
  launch_pdl(advance_kernel, dim3(1), dim3(1), 0, s, pos, T);
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
