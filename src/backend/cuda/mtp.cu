// The MTP step's input rows and the kept hidden rows (mtp.h): one block per row, the norm's sum of
// squares by a block reduction.
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mtp.h"

namespace lily::cuda {
namespace {

constexpr int kThreads = 256;

// y[i] = x[i] · rsqrt(mean(x²) + eps) · w[i] for one row, by the whole block.
__device__ __forceinline__ void norm_row(const float* __restrict__ x, const float* __restrict__ w, int H, float eps,
                                         float* __restrict__ y, float* red) {
  float ss = 0.f;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += x[i] * x[i];
  ss = block_sum(ss, red);
  const float inv = rsqrtf(ss / float(H) + eps);
  for (int i = threadIdx.x; i < H; i += blockDim.x) y[i] = x[i] * inv * w[i];
}

__global__ void __launch_bounds__(kThreads) mtp_inputs_kernel(const float* __restrict__ e, const float* __restrict__ norm_e,
    const float* __restrict__ norm_h, int H, float eps, const int32_t* __restrict__ hidden,
    const int32_t* __restrict__ row_group, const DevGroup* __restrict__ groups, const DevSlotLayer* __restrict__ slots,
    float* __restrict__ cat, int64_t ldc) {
  __shared__ float red[32];
  pdl_entry();
  const int t = blockIdx.x;
  const DevSlotLayer& sl = slots[groups[row_group[t]].slot];
  const int32_t src = hidden[t];
  const float* h = src >= 0 ? sl.hidden + int64_t(src) * H : sl.hprime;
  float* c = cat + int64_t(t) * ldc;
  norm_row(e + int64_t(t) * H, norm_e, H, eps, c, red);
  norm_row(h, norm_h, H, eps, c + H, red);
}

__global__ void __launch_bounds__(kThreads) keep_rows_kernel(const float* __restrict__ x, const float* __restrict__ w, int H,
    float eps, int last, const int32_t* __restrict__ row_group, const DevGroup* __restrict__ groups,
    const DevSlotLayer* __restrict__ slots) {
  __shared__ float red[32];
  pdl_entry();
  int t;
  float* dst;
  if (last) {
    const DevGroup& g = groups[blockIdx.x];
    t = g.first + g.rows - 1;
    dst = slots[g.slot].hprime;
  } else {
    t = blockIdx.x;
    const DevGroup& g = groups[row_group[t]];
    if (!g.keep) return;
    dst = slots[g.slot].hidden + int64_t(t - g.first) * H;
  }
  norm_row(x + int64_t(t) * H, w, H, eps, dst, red);
}

}  // namespace

void mtp_inputs(const float* e, const float* norm_e, const float* norm_h, int H, float eps, const int32_t* hidden, int T,
                const int32_t* row_group, const DevGroup* groups, const DevSlotLayer* slots, float* cat, int64_t ldc,
                cudaStream_t s) {
  if (T <= 0) return;
  launch_pdl(mtp_inputs_kernel, dim3(unsigned(T)), dim3(kThreads), 0, s, e, norm_e, norm_h, H, eps, hidden, row_group, groups,
             slots, cat, ldc);
  LILY_CU_LAUNCH();
}

void keep_rows(const float* x, const float* w, int H, float eps, KeepMode mode, int n, const int32_t* row_group,
               const DevGroup* groups, const DevSlotLayer* slots, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(keep_rows_kernel, dim3(unsigned(n)), dim3(kThreads), 0, s, x, w, H, eps, mode == KeepMode::Last ? 1 : 0,
             row_group, groups, slots);
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
