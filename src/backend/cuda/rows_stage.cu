// The staging pass of the multi-row products (rows_stage.h): a block per activation row.
#include "backend/cuda/gemm_stage.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/rows_frag.cuh"
#include "backend/cuda/rows_stage.h"

namespace lily::cuda {
namespace {

constexpr int kThreads = 256;

// Thread u of a pass takes lane unit u = 4·ch + c of the row (16 elements), so the four units of a chunk are
// adjacent lanes and Σx reduces over lane bits 0 and 1 as in the product's fold.
template <int MODE>
__global__ void __launch_bounds__(kThreads) rows_stage_kernel(const float* __restrict__ x, int64_t ldx, int in,
                                                              const float* __restrict__ norm_w, float eps,
                                                              uint32_t* __restrict__ out, float* __restrict__ sx) {
  __shared__ float inv_s;
  allow_dependent_launch();
  grid_dependency_wait();
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  const float* row = x + int64_t(r) * ldx;
  float iv = 1.f;
  if (norm_w) {
    if (tid < 32) {
      const float v = rows_inv_rms(row, in, lane, eps);
      if (lane == 0) inv_s = v;
    }
    __syncthreads();
    iv = inv_s;
  }
  const int units = in / 16, nch = in / 64;
  uint32_t* orow = out + int64_t(r) * in;
  for (int base = 0; base < units; base += kThreads) {  // warp-uniform trip count (units % 4 == 0)
    const int u = base + tid;
    const bool live = u < units;
    float v = 0.f;
    if (live) {
      const int ch = u >> 2, c = u & 3;
      float sum = 0.f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = ch * 64 + 16 * c + 8 * half;
        float4 X0 = *reinterpret_cast<const float4*>(row + e), X1 = *reinterpret_cast<const float4*>(row + e + 4);
        if (norm_w) rows_norm8(X0, X1, iv, norm_w + e);
        sum += rows_sum8(X0, X1);
#pragma unroll
        for (int sub = 0; sub < 2; ++sub) {
          uint32_t bh[2], bl[2];
          rows_bfrag<MODE>(X0, X1, sub, bh, bl);
          reinterpret_cast<uint4*>(orow)[4 * u + 2 * half + sub] = make_uint4(bh[0], bh[1], bl[0], bl[1]);
        }
      }
      v = sum;
    }
    if (base + (tid & ~31) < units) {  // the warp holds units: Σx of each chunk over its four lanes
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (live && (u & 3) == 0) sx[int64_t(r) * nch + (u >> 2)] = v;
    }
  }
}

}  // namespace

RowsStaged rows_stage(int mode, const float* x, int64_t ldx, int in, int rows, const float* norm_w, float eps,
                      cudaStream_t s) {
  if (in % 64 != 0 || ldx % 4 != 0 || !aligned16(x) || (norm_w && !aligned16(norm_w)))
    fail_internal("rows_stage: needs in % 64 == 0 and 16-byte aligned rows");
  const size_t words = size_t(rows) * size_t(in), sums = size_t(rows) * size_t(in / 64);
  auto* base = static_cast<uint32_t*>(rows_stage_buffer(s, 4 * (words + sums)));
  RowsStaged st{base, reinterpret_cast<const float*>(base + words)};
  if (rows <= 0) return st;
  PdlLaunch L(dim3(unsigned(rows)), dim3(kThreads), 0, s);
  auto* k = mode == 4 ? rows_stage_kernel<4> : rows_stage_kernel<0>;
  LILY_CU(cudaLaunchKernelEx(&L.cfg, k, x, ldx, in, norm_w, eps, base, reinterpret_cast<float*>(base + words)));
  LILY_CU_LAUNCH();
  return st;
}

}  // namespace lily::cuda
