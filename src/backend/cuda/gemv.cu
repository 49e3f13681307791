// Decode GEMV on bf16 or MLX-affine weights (1–2 input rows, or one row per MoE slot).
//
// Memory-level parallelism is the whole game at batch 1: a block stages its input row once in shared
// memory (RMS-normalised when asked), then every warp streams RPW weight rows at once (RPW 16-byte
// loads in flight per lane and iteration, the staged x read once for all of them). Rows shorter than
// 32 uint4 share a warp (LPR lanes per row); few rows split the reduction dimension over KS warps of
// a block (partials summed through shared memory). The host picks RPW / LPR / KS from the shape so the
// grid covers the GPU with enough loads in flight.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/device_info.h"
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

constexpr int kWarps = 8;


__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Affine x layout in shared memory: uint4 i of a row holds codes [C·i, C·i + C) (C = 128 / BITS);
// element e = C·i + j sits at float4 slot (i / 32)·8C + (j / 4)·32 + (i % 32), so the 32 lanes reading
// uint4s i..i+31 read 512 contiguous bytes per float4 (conflict-free).
template <int BITS>
__device__ __forceinline__ int xs_index(int e) {
  constexpr int C = 128 / BITS;
  const int i = e / C, j = e % C;
  return (i >> 5) * 32 * C + (j >> 2) * 128 + (i & 31) * 4 + (j & 3);
}

// MODE 0: bf16, 16-byte loads; 4 / 8: affine bits; kMant4: 4-bit codes dequantised without int->float
// conversions or shifts (KernelSwitches::gemv_mantissa). Code j of a word (bits 4j..4j+3) masked in place and
// or-ed into 2^23's bit pattern is the float 2^23 + c·2^(4j) exactly (for j < 5; codes 5-7 after one shift of
// the word by 20, as j − 5), so (f − 2^23) = c·2^e_j exactly, and x is staged pre-scaled by 2^−e_j. Per code a
// LOP3, an FADD and an FFMA against a shift, an and, an I2F (16 a clock per SM on Hopper: ~2 TB/s of 4-bit
// codes) and an FFMA. Σ x per 16-byte column (for the affine bias) is staged beside x, unscaled.
// NR = rows streamed together (RPW, or 2·RPW for SwiGLU: gate rows r.. then up rows r + I..). The first two
// iterations' weights (and affine scales) are loaded before the input row is staged, so DRAM latency overlaps
// the staging; afterwards each buffer is refilled right after it is consumed.
// fold.counter != null: after its outputs, the last block to finish runs the top-k on each slot's row of y
// (dense rows: a token each; warp t takes token t).
struct Fold {
  TopkArgs a;
  unsigned* counter = nullptr;
};

constexpr int kMant4 = 5;

template <int MODE, int RPW, bool SWI>
__global__ void __launch_bounds__(32 * kWarps, 2) gemv_kernel(const Mat W, const int32_t* __restrict__ expert, int in,
    int nrows, const float* __restrict__ x, int64_t ldx, int xdiv, float* __restrict__ y, int64_t ldy, bool accumulate,
    int swiglu_I, const float* __restrict__ norm_w, float eps, int lpr, int ks, int ntiles, const Fold fold) {
  constexpr int NR = SWI ? 2 * RPW : RPW;
  constexpr int BITS = MODE == kMant4 ? 4 : MODE;
  constexpr int C = MODE == 0 ? 8 : 128 / BITS;  // elements per uint4
  extern __shared__ float4 xs4[];
  float* xs = reinterpret_cast<float*>(xs4);
  // kMant4: Σ x of each 16-byte column, after the staged row (padded to whole 32-column blocks)
  float* colsum = xs + (MODE == 0 ? 0 : (in + 32 * C - 1) / (32 * C) * (32 * C));
  __shared__ float red[32];
  __shared__ float part[kWarps][NR * 4];  // per warp: NR rows × up to 4 sub-rows (lpr = 8)
  const int slot = blockIdx.y;
  allow_dependent_launch();
  // Programmatic dependent launch: everything before grid_dependency_wait() may overlap the previous
  // kernel, so only the weights (never written by kernels) are touched before it; expert ids are
  // produced by the previous kernel, so slot GEMVs wait first.
  if (expert) grid_dependency_wait();
  const int e = expert ? expert[slot] : 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / lpr, sl = lane % lpr, nsub = 32 / lpr;
  const int kslice = warp % ks, rgroup = warp / ks;
  const int rows_per_block = (kWarps / ks) * nsub * RPW;
  const int rsub = (rgroup * nsub + sub) * RPW;  // this lane's first row within a tile
  const int n = in / C;                           // uint4 per row
  int64_t rows[NR];
  const uint4* wrow[NR];
  const uint16_t *srow[NR], *brow[NR];
  auto set_rows = [&](int tile) {
    const int rbase = tile * rows_per_block + rsub;
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      const int r = min(rbase + j, nrows - 1);  // rows past the end repeat the last one, never written
      rows[j] = r;
      if constexpr (SWI) rows[RPW + j] = r + swiglu_I;
    }
#pragma unroll
    for (int j = 0; j < NR; ++j) {
      if constexpr (MODE == 0) {
        wrow[j] = reinterpret_cast<const uint4*>(W.w + int64_t(e) * W.estride + rows[j] * W.ld);
      } else {
        wrow[j] = reinterpret_cast<const uint4*>(W.q + int64_t(e) * W.qstride + rows[j] * W.row_words);
        const int64_t gi = int64_t(e) * W.sstride + rows[j] * (in / W.gs);
        srow[j] = W.s + gi;
        brow[j] = W.b + gi;
      }
    }
  };
  set_rows(blockIdx.x);
  struct Buf {
    uint4 w[NR];
    float s[NR], b[NR];
  };
  auto load = [&](Buf& B, int i) {
#pragma unroll
    for (int j = 0; j < NR; ++j) B.w[j] = ld_stream(wrow[j] + i);
    if constexpr (MODE != 0) {
      const int g = (i * C) / W.gs;
#pragma unroll
      for (int j = 0; j < NR; ++j) {
        B.s[j] = bf(__ldg(srow[j] + g));
        B.b[j] = bf(__ldg(brow[j] + g));
      }
    }
  };
  const int step = lpr * ks, i0 = sl + lpr * kslice;
  Buf A, B;
  if (i0 < n) load(A, i0);
  if (i0 + step < n) load(B, i0 + step);

  // the norm weight is constant: pull this thread's part into L1 while the previous kernel finishes
  if (norm_w)
    for (int f = threadIdx.x; f < in / 4; f += 32 * kWarps)
      asm volatile("prefetch.global.L1 [%0];" ::"l"(norm_w + 4 * f));
  if (!expert) grid_dependency_wait();
  // stage the input row (RMS-normalised when asked): one pass, 16-byte loads when aligned
  const float* xr = x + int64_t(slot / xdiv) * ldx;
  const bool vec = (reinterpret_cast<uintptr_t>(xr) & 15) == 0 && in % 4 == 0 && in <= 4 * 4 * 32 * kWarps;
  auto put4 = [&](int e0, float4 v) {  // elements e0..e0+3 (e0 % 4 == 0) are contiguous in both layouts
    if constexpr (MODE == kMant4) {  // positions 0-3 of a word: 2^0, 2^-4, 2^-8, 2^-12; 4-7: 2^-16, 2^0, 2^-4, 2^-8
      if (e0 & 4) v = make_float4(v.x * 0x1p-16f, v.y, v.z * 0x1p-4f, v.w * 0x1p-8f);
      else v = make_float4(v.x, v.y * 0x1p-4f, v.z * 0x1p-8f, v.w * 0x1p-12f);
    }
    if constexpr (MODE == 0) xs4[e0 >> 2] = v;
    else *reinterpret_cast<float4*>(xs + xs_index<BITS>(e0)) = v;
  };
  if (vec) {
    constexpr int kMaxV = 4;  // float4 per thread: in <= 4096
    float4 v[kMaxV];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxV; ++k) {
      const int f = threadIdx.x + 32 * kWarps * k;
      v[k] = f < in / 4 ? __ldg(reinterpret_cast<const float4*>(xr) + f) : make_float4(0.f, 0.f, 0.f, 0.f);
      ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    float inv = 1.f;
    if (norm_w) inv = rsqrtf(block_sum(ss, red) / float(in) + eps);
#pragma unroll
    for (int k = 0; k < kMaxV; ++k) {
      const int f = threadIdx.x + 32 * kWarps * k;
      if (f < in / 4) {
        float4 t = v[k];
        if (norm_w) {
          const float4 w4 = __ldg(reinterpret_cast<const float4*>(norm_w) + f);
          t = make_float4(t.x * inv * w4.x, t.y * inv * w4.y, t.z * inv * w4.z, t.w * inv * w4.w);
        }
        put4(4 * f, t);
        v[k] = t;
      }
    }
    if constexpr (MODE == kMant4) {  // the 8 float4 of a 32-element column sit in 8 consecutive lanes
#pragma unroll
      for (int k = 0; k < kMaxV; ++k) {
        const int f = threadIdx.x + 32 * kWarps * k;
        float t = f < in / 4 ? v[k].x + v[k].y + v[k].z + v[k].w : 0.f;
        t += __shfl_xor_sync(0xffffffffu, t, 1);
        t += __shfl_xor_sync(0xffffffffu, t, 2);
        t += __shfl_xor_sync(0xffffffffu, t, 4);
        if (f < in / 4 && (f & 7) == 0) colsum[f >> 3] = t;
      }
    }
  } else {
    float inv = 1.f;
    if (norm_w) {
      float ss = 0.f;
      for (int i = threadIdx.x; i < in; i += blockDim.x) ss += xr[i] * xr[i];
      inv = rsqrtf(block_sum(ss, red) / float(in) + eps);
    }
    for (int i = threadIdx.x; i < in; i += blockDim.x) {
      const float v = norm_w ? xr[i] * inv * norm_w[i] : xr[i];
      if constexpr (MODE == 0) xs[i] = v;
      else if constexpr (MODE == kMant4) {
        const int p = i & 7;
        xs[xs_index<BITS>(i)] = v * __int_as_float((127 - 4 * (p < 5 ? p : p - 5)) << 23);
      } else xs[xs_index<BITS>(i)] = v;
    }
    if constexpr (MODE == kMant4)
      for (int c = threadIdx.x; c < in / C; c += blockDim.x) {
        float t = 0.f;
        for (int k = 0; k < C; ++k) t += norm_w ? xr[C * c + k] * inv * norm_w[C * c + k] : xr[C * c + k];
        colsum[c] = t;
      }
  }
  __syncthreads();

  float acc[NR];
  auto consume = [&](const Buf& Bf, int i) {
    if constexpr (MODE == 0) {
      const float4 a = xs4[2 * i], b = xs4[2 * i + 1];
#pragma unroll
      for (int j = 0; j < NR; ++j) {
        float f[8];
        bf8(Bf.w[j], f);
        acc[j] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
      }
    } else {
      const float4* x4 = xs4 + (i >> 5) * 8 * C + (i & 31);
      float xv[C];
#pragma unroll
      for (int k = 0; k < C / 4; ++k) {
        const float4 v = x4[k * 32];
        xv[4 * k] = v.x; xv[4 * k + 1] = v.y; xv[4 * k + 2] = v.z; xv[4 * k + 3] = v.w;
      }
      float sx = 0.f;
      if constexpr (MODE == kMant4) {
        sx = colsum[i];
      } else {
#pragma unroll
        for (int k = 0; k < C; ++k) sx += xv[k];
      }
#pragma unroll
      for (int j = 0; j < NR; ++j) {
        const uint32_t words[4] = {Bf.w[j].x, Bf.w[j].y, Bf.w[j].z, Bf.w[j].w};
        float qx = 0.f;
        if constexpr (MODE == kMant4) {
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const uint32_t hi = words[w] >> 20;
#pragma unroll
            for (int p = 0; p < 8; ++p) {
              const uint32_t m = p < 5 ? (words[w] & (15u << (4 * p))) : (hi & (15u << (4 * (p - 5))));
              qx = fmaf(__uint_as_float(m | 0x4B000000u) - 8388608.f, xv[8 * w + p], qx);
            }
          }
        } else {
#pragma unroll
          for (int k = 0; k < C; ++k) {
            constexpr int PER = 32 / BITS;  // codes per word
            const uint32_t code = (words[k / PER] >> ((k % PER) * BITS)) & ((1u << BITS) - 1u);
            qx += float(code) * xv[k];
          }
        }
        acc[j] += Bf.s[j] * qx + Bf.b[j] * sx;
      }
    }
  };
  // Tiles of rows_per_block rows, grid-strided: the next tile's first loads are issued before this
  // tile's reductions and stores.
  for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const int rbase = tile * rows_per_block + rsub;
#pragma unroll
    for (int j = 0; j < NR; ++j) acc[j] = 0.f;
    for (int i = i0; i < n; i += 2 * step) {
      consume(A, i);
      if (i + 2 * step < n) load(A, i + 2 * step);
      if (i + step < n) {
        consume(B, i + step);
        if (i + 3 * step < n) load(B, i + 3 * step);
      }
    }
    if (tile + int(gridDim.x) < ntiles) {
      set_rows(tile + gridDim.x);
      if (i0 < n) load(A, i0);
      if (i0 + step < n) load(B, i0 + step);
    }
    // reduce over the lpr lanes of a row, then over the ks warps of a row group
#pragma unroll
    for (int j = 0; j < NR; ++j)
      for (int o = lpr >> 1; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    if (ks > 1) {
      if (sl == 0)
#pragma unroll
        for (int j = 0; j < NR; ++j) part[warp][j * 4 + sub] = acc[j];
      __syncthreads();
      if (kslice == 0)
#pragma unroll
        for (int j = 0; j < NR; ++j) {
          float t = 0.f;
          for (int k = 0; k < ks; ++k) t += part[warp + k][j * 4 + sub];
          acc[j] = t;
        }
      __syncthreads();  // part[] is rewritten by the next tile
    }
    if (sl == 0 && kslice == 0) {
#pragma unroll
      for (int j = 0; j < RPW; ++j) {
        const int r = rbase + j;
        if (r >= nrows) break;
        const float v = SWI ? silu(acc[j]) * acc[RPW + j] : acc[j];
        float* yp = y + int64_t(slot) * ldy + r;
        *yp = accumulate ? *yp + v : v;
      }
    }
  }
  if (fold.counter) {
    __shared__ bool last;
    __threadfence();  // this block's outputs are visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(fold.counter, 1u) == gridDim.x * gridDim.y - 1;
    __syncthreads();
    if (last && warp < int(gridDim.y)) {
      __threadfence();
      topk_warp(y + int64_t(warp) * ldy, warp, fold.a);
      if (warp == 0 && lane == 0) *fold.counter = 0u;
    }
  }
}

template <int MODE, int RPW, bool SWI>
void launch(dim3 grid, size_t smem, cudaStream_t s, const Mat& W, const int32_t* expert, int in, int nrows,
            const float* x, int64_t ldx, int xdiv, float* y, int64_t ldy, bool accumulate, int swiglu_I,
            const float* norm_w, float eps, int lpr, int ks, int ntiles, const Fold& fold) {
  PdlLaunch L(grid, dim3(32 * kWarps), smem, s);
  LILY_CU(cudaLaunchKernelEx(&L.cfg, gemv_kernel<MODE, RPW, SWI>, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate,
                             swiglu_I, norm_w, eps, lpr, ks, ntiles, fold));
}

template <int MODE, bool SWI>
void launch_rpw(int rpw, dim3 grid, size_t smem, cudaStream_t s, const Mat& W, const int32_t* expert, int in, int nrows,
                const float* x, int64_t ldx, int xdiv, float* y, int64_t ldy, bool accumulate, int swiglu_I,
                const float* norm_w, float eps, int lpr, int ks, int ntiles, const Fold& fold) {
  if (rpw == 4) launch<MODE, 4, SWI>(grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, lpr, ks, ntiles, fold);
  else if (rpw == 2) launch<MODE, 2, SWI>(grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, lpr, ks, ntiles, fold);
  else launch<MODE, 1, SWI>(grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, lpr, ks, ntiles, fold);
}

template <int MODE>
void launch_mode(bool swi, int rpw, dim3 grid, size_t smem, cudaStream_t s, const Mat& W, const int32_t* expert, int in,
                 int nrows, const float* x, int64_t ldx, int xdiv, float* y, int64_t ldy, bool accumulate, int swiglu_I,
                 const float* norm_w, float eps, int lpr, int ks, int ntiles, const Fold& fold) {
  if (swi) launch_rpw<MODE, true>(rpw, grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, lpr, ks, ntiles, fold);
  else launch_rpw<MODE, false>(rpw, grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, lpr, ks, ntiles, fold);
}

constexpr size_t kMaxSmem = 96 * 1024;

template <int MODE, bool SWI>
void set_smem() {
  LILY_CU(cudaFuncSetAttribute(gemv_kernel<MODE, 1, SWI>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
  LILY_CU(cudaFuncSetAttribute(gemv_kernel<MODE, 2, SWI>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
  LILY_CU(cudaFuncSetAttribute(gemv_kernel<MODE, 4, SWI>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
}

}  // namespace

void init_gemv_kernels() {
  set_smem<0, false>(); set_smem<0, true>();
  set_smem<4, false>(); set_smem<4, true>();
  set_smem<kMant4, false>(); set_smem<kMant4, true>();
  set_smem<8, false>(); set_smem<8, true>();
}

GemvShape gemv_shape(int mode, int in, int nrows, int slots, int sm_count, bool swiglu) {
  GemvShape g;
  const int C = mode == 0 ? 8 : 128 / mode;
  const int n = in / C;  // uint4 per row
  g.lpr = n >= 32 ? 32 : n >= 16 ? 16 : 8;
  const int nsub = 32 / g.lpr;
  // One wave is one resident block per slot of every SM. Rows are cut into tiles of (8 / KS)·nsub·RPW rows;
  // blocks stride over tiles, so the time is set by the rounds of the busiest block: pick the largest
  // RPW whose rounds are well balanced, and split the reduction over KS warps when rows are few.
  // Two resident blocks per SM (the launch bounds; ~90-120 registers per thread).
  auto wave = [&](int) { return int64_t(2) * sm_count; };
  auto tiles = [&](int rpw, int ks) { return int64_t(cdiv(nrows, int64_t(kWarps / ks) * nsub * rpw)); };
  auto balance = [&](int rpw) {  // useful fraction of the busiest block's rounds
    const int64_t t = tiles(rpw, 1) * slots, w = wave(rpw), rounds = (t + w - 1) / w;
    return double(t) / double(rounds * std::min<int64_t>(w, t));
  };
  g.ks = 1;
  g.rpw = swiglu ? 2 : 4;  // SwiGLU streams 2·RPW rows
  while (g.rpw > 1 && (tiles(g.rpw, 1) * slots < wave(g.rpw) || balance(g.rpw) < 0.85)) g.rpw /= 2;
  while (g.ks < kWarps && tiles(g.rpw, g.ks) * slots < wave(g.rpw) && n / (g.lpr * g.ks * 2) >= 2) g.ks *= 2;
  g.tiles = int(tiles(g.rpw, g.ks));
  g.blocks = int(std::min<int64_t>(g.tiles, std::max<int64_t>(1, wave(g.rpw) / slots)));
  // Many slots (the experts of a many-row step): one block per slot would leave SMs idle and stream each
  // expert through one block. Pick b blocks per slot by time ∝ rounds(b) · ceil(tiles / b) for the work
  // slots · tiles, rounds(b) = ceil(slots · b / wave).
  const int64_t w = wave(g.rpw);
  if (w / slots < 4) {
    double best = 0;
    for (int64_t b = 1; b <= std::min<int64_t>(g.tiles, 64); ++b) {
      const int64_t rounds = (slots * b + w - 1) / w, per = (g.tiles + b - 1) / b;
      const double eff = double(slots) * g.tiles / double(rounds * w * per);
      if (eff > best + 1e-9) {
        best = eff;
        g.blocks = int(b);
      }
    }
  }
  return g;
}

namespace {

void gemv_run(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv, int slots,
              float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w, float eps,
              const Fold& fold) {
  const int sm_count = device_sm_count();
  const int mode = W.affine ? W.bits : 0;
  const int nrows = swiglu_I > 0 ? swiglu_I : out;
  const GemvShape g = gemv_shape(mode, in, nrows, slots, sm_count, swiglu_I > 0);
  // the staged row, padded to whole 32-column blocks; 4-bit rows add Σ x per column (kMant4)
  const size_t smem = sizeof(float) * (mode == 0 ? size_t(in)
                                                 : size_t((in + 32 * (128 / mode) - 1) / (32 * (128 / mode)) * (32 * (128 / mode))) +
                                                       (mode == 4 ? size_t(in / 32) : 0));
  if (smem > kMaxSmem) fail_internal("GEMV: input row longer than the shared-memory stage (24K floats)");
  dim3 grid(unsigned(g.blocks), unsigned(slots));
  const bool swi = swiglu_I > 0;
  switch (mode) {
    case 0: launch_mode<0>(swi, g.rpw, grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, g.lpr, g.ks, g.tiles, fold); break;
    case 4:
      if (kernel_switches().gemv_mantissa)
        launch_mode<kMant4>(swi, g.rpw, grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, g.lpr, g.ks, g.tiles, fold);
      else
        launch_mode<4>(swi, g.rpw, grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, g.lpr, g.ks, g.tiles, fold);
      break;
    case 8: launch_mode<8>(swi, g.rpw, grid, smem, s, W, expert, in, nrows, x, ldx, xdiv, y, ldy, accumulate, swiglu_I, norm_w, eps, g.lpr, g.ks, g.tiles, fold); break;
    default: fail_internal("GEMV: unsupported mode");
  }
  LILY_CU_LAUNCH();
}

}  // namespace

void gemv_fast(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv, int slots,
               float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w, float eps) {
  gemv_run(W, expert, out, in, x, ldx, xdiv, slots, y, ldy, accumulate, swiglu_I, s, norm_w, eps, Fold{});
}

bool gemv_topk(const Mat& W, int out, int in, const float* x, int rows, float* y, const float* norm_w, float eps,
               const TopkArgs& topk, unsigned* counter, cudaStream_t s) {
  static_assert(kTopkFoldRows <= kWarps, "a warp per token in the last block");
  if (W.exl3 || !counter || rows < 1 || rows > kTopkFoldRows) return false;
  const bool ok = W.affine ? (W.bits == 4 || W.bits == 8) && in % 32 == 0 && W.gs % 32 == 0 && W.row_words % 4 == 0 &&
                                 aligned16(W.q)
                           : in % 8 == 0 && W.ld % 8 == 0 && aligned16(W.w);
  if (!ok) return false;
  Fold f;
  f.a = topk;
  f.counter = counter;
  gemv_run(W, nullptr, out, in, x, in, 1, rows, y, out, false, 0, s, norm_w, eps, f);
  return true;
}

}  // namespace lily::cuda
