// Row-scale pre-pass of the fp16 prompt GEMMs (row_scales.h): one warp per row, max |x| over the row
// (fmaxf: NaN elements do not count, the row keeps them), then the exponent rule of backend/fp16_scale.h.
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/row_scales.h"

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
  const int row0 = tiles[3 * tile + 1], nrows = min(tiles[3 * tile + 2], kGemmBM);
  const int lane = threadIdx.x & 31;
  for (int j = int(threadIdx.x >> 5); j < nrows; j += kWarps) {
    const int r = row0 + j;
    const float v = row_scale_value(x + int64_t(gather ? gather[r] : r) * ldx, in, lane);
    if (lane == 0) out[r] = v;
  }
}

// One buffer per (device, stream). A grown buffer's predecessor is kept until the process ends: a captured
// graph may still name it.
struct Buffers {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, std::pair<float*, int64_t>> live;
  std::vector<float*> retired;
};
Buffers& buffers() {
  static Buffers* b = new Buffers;  // never destroyed: streams may outlive static destruction order
  return *b;
}

float* buffer(cudaStream_t s, int64_t rows) {
  int dev = 0;
  LILY_CU(cudaGetDevice(&dev));
  Buffers& b = buffers();
  std::lock_guard<std::mutex> lock(b.mu);
  auto& e = b.live[{dev, s}];
  if (e.second >= rows) return e.first;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  LILY_CU(cudaStreamIsCapturing(s, &st));
  if (st != cudaStreamCaptureStatusNone)
    fail_internal("fp16 GEMM row scales: the stream's buffer is too small inside a capture (reserve_row_scales first)");
  const int64_t cap = std::max<int64_t>({rows, 2 * e.second, 4096});
  float* p = nullptr;
  LILY_CU(cudaMalloc(&p, sizeof(float) * size_t(cap)));
  if (e.first) b.retired.push_back(e.first);
  e = {p, cap};
  return p;
}

}  // namespace

void reserve_row_scales(cudaStream_t s, int64_t rows) { (void)buffer(s, std::max<int64_t>(rows, 1)); }

RowScales row_scales(const float* x, int64_t ldx, int in, const int32_t* gather, const int32_t* tiles,
                     const int32_t* n_tiles, int max_tiles, int T, int x_rows, cudaStream_t s) {
  RowScales rs;
  rs.by_src = x_rows > 0 || !tiles;
  const int n = x_rows > 0 ? x_rows : T;
  float* out = buffer(s, std::max(n, 1));
  rs.s = out;
  if (n <= 0 || (tiles && max_tiles <= 0 && x_rows <= 0)) return rs;
  if (rs.by_src)
    scale_rows_kernel<<<cdiv(n, kWarps), 32 * kWarps, 0, s>>>(x, ldx, in, n, out);
  else
    scale_tiles_kernel<<<unsigned(max_tiles), 32 * kWarps, 0, s>>>(x, ldx, in, gather, tiles, n_tiles, out);
  LILY_CU_LAUNCH();
  return rs;
}

}  // namespace lily::cuda
