// Multi-row products (rows.h): decode steps of 2..32 rows read each weight once.
//
// Block: 8 warps; warp w owns 32 weight rows (two m16 tiles; SwiGLU: 16 gate rows and the matching 16 up
// rows) and the k chunks c ≡ w % ks (mod ks) of 64 elements; the ks warps of a row group are summed through
// shared memory in a fixed order. The block's activation rows (8·NF, zero-padded) are the MMA's N side.
//
// Fragment order: in a 64-wide chunk, lane (g = lane / 4, c = lane % 4) reads elements [16c, 16c + 16) of
// weight rows g and g + 8 (4-bit: one uint2, 8-bit: one uint4, bf16: two uint4) and the same 16 elements
// of activation row g of each n8 fragment (four float4). The chunk's four k16 steps take these 16 elements
// as the MMA's k positions {2c, 2c+1, 2c+8, 2c+9} in an order both operands share: 8-bit and bf16 in
// element order, 4-bit as the pairs (i, i+4) of each 8-code word, which one shift and mask extract.
// Affine codes enter the MMA as exact bf16 integers; per chunk s·(Σ q·x) + b·(Σ x) is folded in fp32.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/device_info.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/rows.h"
#include "backend/cuda/rows_frag.cuh"
#include "backend/cuda/rows_stage.h"

namespace lily::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ uint2 ld_stream2(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_stream4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Staged activation words and sums (read by every block, so L1 may keep them): predicated loads, zeros where
// !ok, with no branch, so that the compiler can issue them all ahead of their use.
__device__ __forceinline__ uint4 ld_x4_if(const void* p, bool ok) {
  uint4 v;
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"
      " mov.b32 %3, 0;\n @q ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n}"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "r"(int(ok)));
  return v;
}
__device__ __forceinline__ float ld_f_if(const float* p, bool ok) {
  float v;
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n mov.b32 %0, 0;\n @q ld.global.nc.f32 %0, [%1];\n}"
               : "=f"(v) : "l"(p), "r"(int(ok)));
  return v;
}

// Codes enter the MMA centred, q - 2^(bits-1), exact in bf16; the fold then adds (b + 2^(bits-1)·s)·Σx, which
// keeps s·Σq·x and b·Σx from cancelling (MLX biases sit near -2^(bits-1)·s).
template <int MODE>
constexpr float kCodeOffset = MODE == 4 ? 8.f : 128.f;

// Nibbles at bit sh and sh + 16 of w as the exact bf16 pair (q_lo - 8, q_hi - 8): 128 + q by the exponent
// trick, then 136 subtracted (exact).
__device__ __forceinline__ uint32_t nib_pair(uint32_t w, int sh) {
  uint32_t v = ((w >> sh) & 0x000F000Fu) | 0x43004300u;
  __nv_bfloat162 b = *reinterpret_cast<__nv_bfloat162*>(&v);
  return bf2_bits(__hsub2(b, __floats2bfloat162_rn(136.f, 136.f)));
}
// Bytes i and i + 1 of w as the exact bf16 pair (q - 128): 2^23 + q by the exponent trick, 2^23 + 128
// subtracted.
__device__ __forceinline__ uint32_t byte_pair(uint32_t w, int i) {
  const float a = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + unsigned(i))) - 8388736.f;
  const float b = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + unsigned(i + 1))) - 8388736.f;
  return bf2_bits(__floats2bfloat162_rn(a, b));
}

template <int MT, int NF>
__device__ __forceinline__ void zero(float (&a)[MT][NF][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int f = 0; f < NF; ++f)
#pragma unroll
      for (int i = 0; i < 4; ++i) a[mt][f][i] = 0.f;
}

// One chunk's operands of a lane: weight rows (mt, h) = m16 tile mt, row g + 8h; staged products also the
// chunk's B fragments (xf[f][s]: k16 step s of fragment f) and Σx of the lane's two C columns per fragment,
// loaded with the weights, a chunk ahead of their use.
template <int MODE, int MT, int NF>
struct WChunk {
  static constexpr int WORDS = MODE == 4 ? 2 : MODE == 8 ? 4 : 8;
  uint32_t w[MT][2][WORDS];
  float s[MT][2], b[MT][2];
  uint4 xf[NF][4];
  float xs[NF][2];
};

// MODE 0 bf16, 4 / 8 affine bits. NF n8 fragments (8·NF activation rows). SWI: m16 tile 0 gate rows, 1 the
// matching up rows; output silu(gate)·up. NB register buffers of weight chunks: NB − 1 chunks in flight per
// lane while one is consumed. MT m16 tiles per warp (2; 1 halves a warp's rows, doubling the blocks of a
// small matrix; SwiGLU needs 2). STG: the activation rows come staged (rows_stage.h: xs words, sxs sums per
// chunk, any norm already applied), indexed like x; x and norm_w are then unused.
template <int MODE, int NF, bool SWI, int NB, int MT, bool STG>
__global__ void __launch_bounds__(32 * kWarps, (MODE == 0 || NF > 1) ? 1 : 2)
    rows_kernel(const Mat W, int in, int nrows, const float* __restrict__ x, int64_t ldx,
                const int32_t* __restrict__ gather, float* __restrict__ y, int64_t ldy, bool accumulate, int swiglu_I,
                const int32_t* __restrict__ tiles, const int32_t* __restrict__ n_tiles, int T, int ks,
                const float* __restrict__ norm_w, float eps, const uint32_t* __restrict__ xs,
                const float* __restrict__ sxs) {
  static_assert(!SWI || MT == 2, "SwiGLU: tile 0 gate rows, tile 1 up rows");
  extern __shared__ __align__(16) float red[];  // ks > 1: [kWarps][MT·NF·4][32], the k groups' partial sums
  __shared__ float inv_s[8 * NF];  // norm_w: 1 / rms of each activation row of the block
  constexpr int NACC = MT * NF * 4;
  // staged fragments a chunk ahead, with the weights, where the registers allow (32 rows would need ~150 more,
  // 8-bit at two blocks an SM spills); otherwise each k16 step loads its own
  constexpr bool XPF = STG && NF <= 2 && !(MODE == 8 && NF == 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int mg = warp / ks, kq = warp % ks;
  allow_dependent_launch();
  // weights are never written by kernels: a dense product requests its first chunk before the wait
  if (tiles) grid_dependency_wait();
  int e = 0, row0 = 0, count = T;
  if (tiles) {
    const int t = blockIdx.y;
    if (t >= *n_tiles) return;
    e = tiles[3 * t]; row0 = tiles[3 * t + 1]; count = min(tiles[3 * t + 2], 8 * NF);
  }
  constexpr int RW = SWI ? 16 : 16 * MT;  // output rows per warp
  const int rb = (int(blockIdx.x) * (kWarps / ks) + mg) * RW;
  int64_t wr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (SWI) wr[mt][h] = min(rb + g + 8 * h, nrows - 1) + mt * swiglu_I;
      else wr[mt][h] = min(rb + 16 * mt + g + 8 * h, nrows - 1);  // rows past the end repeat, never written
    }
  // groups per row; gs / 64 is a power of two (rows_covers), so a chunk's group is a shift
  const int nch = in / 64, gpr = MODE == 0 ? 0 : in / W.gs, gshift = MODE == 0 ? 0 : __ffs(W.gs / 64) - 1;
  auto load_sb = [&](WChunk<MODE, MT, NF>& Wc, int ch) {
    if constexpr (MODE != 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t gi = int64_t(e) * W.sstride + wr[mt][h] * gpr + (ch >> gshift);
          Wc.s[mt][h] = bf(__ldg(W.s + gi));
          Wc.b[mt][h] = bf(__ldg(W.b + gi)) + kCodeOffset<MODE> * Wc.s[mt][h];  // the centred codes' bias
        }
    }
  };
  auto load_w = [&](WChunk<MODE, MT, NF>& Wc, int ch) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if constexpr (MODE == 4) {
          const uint2 v = ld_stream2(W.q + int64_t(e) * W.qstride + wr[mt][h] * W.row_words + ch * 8 + 2 * c);
          Wc.w[mt][h][0] = v.x; Wc.w[mt][h][1] = v.y;
        } else if constexpr (MODE == 8) {
          const uint4 v = ld_stream4(W.q + int64_t(e) * W.qstride + wr[mt][h] * W.row_words + ch * 16 + 4 * c);
          Wc.w[mt][h][0] = v.x; Wc.w[mt][h][1] = v.y; Wc.w[mt][h][2] = v.z; Wc.w[mt][h][3] = v.w;
        } else {
          const uint16_t* p = W.w + int64_t(e) * W.estride + wr[mt][h] * W.ld + ch * 64 + 16 * c;
          const uint4 v0 = ld_stream4(p), v1 = ld_stream4(p + 8);
          Wc.w[mt][h][0] = v0.x; Wc.w[mt][h][1] = v0.y; Wc.w[mt][h][2] = v0.z; Wc.w[mt][h][3] = v0.w;
          Wc.w[mt][h][4] = v1.x; Wc.w[mt][h][5] = v1.y; Wc.w[mt][h][6] = v1.z; Wc.w[mt][h][7] = v1.w;
        }
      }
    load_sb(Wc, ch);
  };
  WChunk<MODE, MT, NF> buf[NB];
  // warp kq's chunks: kq, kq + ks, ...
#pragma unroll
  for (int b = 0; b < NB - 1; ++b)
    if (kq + b * ks < nch) load_w(buf[b], kq + b * ks);
  if (!tiles) grid_dependency_wait();
  // activation rows of this lane's B fragments (row g of fragment f); padding rows: xr null, or xok / sok false
  const float* xr[NF];
  const uint4* xq[NF];       // STG: this lane's words of its row (chunk 0); xok: the row exists
  const float* sq[NF][2];    // STG: Σx per chunk of activation rows 8f + 2c and 8f + 2c + 1 (the C columns)
  bool xok[NF], sok[NF][2];
#pragma unroll
  for (int f = 0; f < NF; ++f) {
    const int n = 8 * f + g;
    const int64_t src = n < count ? int64_t(gather ? gather[row0 + n] : row0 + n) : -1;
    if constexpr (STG) {
      xok[f] = src >= 0;
      xq[f] = reinterpret_cast<const uint4*>(xs + (xok[f] ? src : 0) * in) + 4 * c;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int m = 8 * f + 2 * c + i;
        sok[f][i] = m < count;
        sq[f][i] = sxs + (sok[f][i] ? int64_t(gather ? gather[row0 + m] : row0 + m) : 0) * nch;
      }
    } else {
      xr[f] = src >= 0 ? x + src * ldx + 16 * c : nullptr;
    }
  }
  // STG: the chunk's B fragments and sums, into the same ring buffer as its weights
  auto load_x = [&](WChunk<MODE, MT, NF>& Wc, int ch) {
    if constexpr (STG) {
#pragma unroll
      for (int f = 0; f < NF; ++f) {
#pragma unroll
        for (int s = 0; s < 4; ++s) Wc.xf[f][s] = ld_x4_if(xq[f] + 16 * ch + s, xok[f]);
        if constexpr (MODE != 0)
#pragma unroll
          for (int i = 0; i < 2; ++i) Wc.xs[f][i] = ld_f_if(sq[f][i] + ch, sok[f][i]);
      }
    }
  };
  auto load = [&](WChunk<MODE, MT, NF>& Wc, int ch) {
    load_w(Wc, ch);
    if constexpr (XPF) load_x(Wc, ch);
  };
  if constexpr (XPF)
#pragma unroll
    for (int b = 0; b < NB - 1; ++b)
      if (kq + b * ks < nch) load_x(buf[b], kq + b * ks);
  // RMSNorm of the activation rows inside the product: a warp per row sums its squares once, the chunks
  // then scale each element by 1/rms · norm_w as they read it
  float inv[NF];
  if (!STG && norm_w) {
    for (int n = warp; n < min(count, 8 * NF); n += kWarps) {
      const float* row = x + int64_t(gather ? gather[row0 + n] : row0 + n) * ldx;
      float ss = 0.f;
      for (int i = 4 * lane; i < in; i += 128) {
        const float4 v = *reinterpret_cast<const float4*>(row + i);
        ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
      }
      ss = warp_sum(ss);
      if (lane == 0) inv_s[n] = rsqrtf(ss / float(in) + eps);
    }
    __syncthreads();
#pragma unroll
    for (int f = 0; f < NF; ++f) inv[f] = 8 * f + g < count ? inv_s[8 * f + g] : 0.f;
  }
  float acc[MT][NF][4];
  zero(acc);

  // one chunk: 4 k16 steps × (hi, lo) MMAs per (tile, fragment); affine: into tmp, folded with s and b
  auto consume = [&](const WChunk<MODE, MT, NF>& Wc, int ch) {
    float tmp[MT][NF][4];
    float sx[NF];
    zero(tmp);
#pragma unroll
    for (int f = 0; f < NF; ++f) sx[f] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float4 X[NF][2];
      if constexpr (!STG) {
#pragma unroll
        for (int f = 0; f < NF; ++f) {
          const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
          X[f][0] = xr[f] ? __ldg(reinterpret_cast<const float4*>(xr[f] + ch * 64 + 8 * half)) : z;
          X[f][1] = xr[f] ? __ldg(reinterpret_cast<const float4*>(xr[f] + ch * 64 + 8 * half + 4)) : z;
          if (norm_w) rows_norm8(X[f][0], X[f][1], inv[f], norm_w + ch * 64 + 16 * c + 8 * half);
          if constexpr (MODE != 0) sx[f] += rows_sum8(X[f][0], X[f][1]);
        }
      }
#pragma unroll
      for (int sub = 0; sub < 2; ++sub) {
        const int s = 2 * half + sub;  // k16 step
        uint32_t bh[NF][2], bl[NF][2];
#pragma unroll
        for (int f = 0; f < NF; ++f) {
          if constexpr (STG) {
            const uint4 q = XPF ? Wc.xf[f][s] : ld_x4_if(xq[f] + 16 * ch + s, xok[f]);
            bh[f][0] = q.x; bh[f][1] = q.y; bl[f][0] = q.z; bl[f][1] = q.w;
          } else {
            rows_bfrag<MODE == 4 ? 4 : 0>(X[f][0], X[f][1], sub, bh[f], bl[f]);
          }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t a[4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (MODE == 4) {
              const uint32_t w = Wc.w[mt][h][half];
              a[h] = nib_pair(w, 8 * sub);
              a[2 + h] = nib_pair(w, 8 * sub + 4);
            } else if constexpr (MODE == 8) {
              const uint32_t w = Wc.w[mt][h][s];
              a[h] = byte_pair(w, 0);
              a[2 + h] = byte_pair(w, 2);
            } else {
              a[h] = Wc.w[mt][h][2 * s];
              a[2 + h] = Wc.w[mt][h][2 * s + 1];
            }
          }
#pragma unroll
          for (int f = 0; f < NF; ++f) {
            if constexpr (MODE == 0) {
              mma_bf16(acc[mt][f], a, bh[f][0], bh[f][1]);
              mma_bf16(acc[mt][f], a, bl[f][0], bl[f][1]);
            } else {
              mma_bf16(tmp[mt][f], a, bh[f][0], bh[f][1]);
              mma_bf16(tmp[mt][f], a, bl[f][0], bl[f][1]);
            }
          }
        }
      }
    }
    if constexpr (MODE != 0) {
      // Σx of activation rows 2c and 2c + 1 of each fragment (the C columns of this lane)
#pragma unroll
      for (int f = 0; f < NF; ++f) {
        float s0, s1;
        if constexpr (STG) {
          s0 = XPF ? Wc.xs[f][0] : ld_f_if(sq[f][0] + ch, sok[f][0]);
          s1 = XPF ? Wc.xs[f][1] : ld_f_if(sq[f][1] + ch, sok[f][1]);
        } else {
          float v = sx[f];
          v += __shfl_xor_sync(0xffffffffu, v, 1);
          v += __shfl_xor_sync(0xffffffffu, v, 2);  // lanes 4n .. 4n + 3: Σx of row n
          s0 = __shfl_sync(0xffffffffu, v, 8 * c);
          s1 = __shfl_sync(0xffffffffu, v, 8 * c + 4);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          acc[mt][f][0] += Wc.s[mt][0] * tmp[mt][f][0] + Wc.b[mt][0] * s0;
          acc[mt][f][1] += Wc.s[mt][0] * tmp[mt][f][1] + Wc.b[mt][0] * s1;
          acc[mt][f][2] += Wc.s[mt][1] * tmp[mt][f][2] + Wc.b[mt][1] * s0;
          acc[mt][f][3] += Wc.s[mt][1] * tmp[mt][f][3] + Wc.b[mt][1] * s1;
        }
      }
    }
  };
  // a ring of NB register buffers (unrolled, so every index is static): before consuming chunk i, the load of
  // chunk i + NB − 1 is issued into the buffer chunk i − 1 freed
  for (int ch = kq; ch < nch; ch += NB * ks) {
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int cc = ch + b * ks;
      if (cc < nch) {
        if (cc + (NB - 1) * ks < nch) load(buf[(b + NB - 1) % NB], cc + (NB - 1) * ks);
        consume(buf[b], cc);
      }
    }
  }
  if (ks > 1) {
    float* mine = red + int64_t(warp) * NACC * 32 + lane;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[((mt * NF + f) * 4 + i) * 32] = acc[mt][f][i];
    __syncthreads();
    if (kq != 0) return;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float t = acc[mt][f][i];
          for (int q = 1; q < ks; ++q) t += red[(int64_t(warp + q) * NACC + (mt * NF + f) * 4 + i) * 32 + lane];
          acc[mt][f][i] = t;
        }
  }
  // C fragment: acc[mt][f][i] is weight row g + 8·(i / 2) of tile mt, activation row 8f + 2c + i % 2
#pragma unroll
  for (int f = 0; f < NF; ++f)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = 8 * f + 2 * c + (i & 1);
      if (n >= count) continue;
      float* yr = y + int64_t(row0 + n) * ldy;
      if constexpr (SWI) {
        const int o = rb + g + 8 * (i >> 1);
        if (o < nrows) {
          const float v = silu(acc[0][f][i]) * acc[1][f][i];
          yr[o] = accumulate ? yr[o] + v : v;
        }
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int o = rb + 16 * mt + g + 8 * (i >> 1);
          if (o < nrows) yr[o] = accumulate ? yr[o] + acc[mt][f][i] : acc[mt][f][i];
        }
      }
    }
}

template <int MODE, int NF, bool SWI, int MT>
void launch(dim3 grid, int ks, cudaStream_t s, const Mat& W, int in, int nrows, const float* x, int64_t ldx,
            const int32_t* gather, float* y, int64_t ldy, bool accumulate, int swiglu_I, const int32_t* tiles,
            const int32_t* n_tiles, int T, const float* norm_w, float eps, const RowsStaged& st) {
  const size_t red = ks > 1 ? sizeof(float) * size_t(kWarps) * MT * NF * 4 * 32 : 0;
  PdlLaunch L(grid, dim3(32 * kWarps), red, s);
  auto* k = rows_kernel<MODE, NF, SWI, 2, MT, false>;
  if constexpr (MODE != 8)  // 8-bit chunks at depth 4 spill at two blocks per SM
    if (kernel_switches().rows_depth >= 4) k = rows_kernel<MODE, NF, SWI, 4, MT, false>;
  if (st.x) k = rows_kernel<MODE, NF, SWI, 2, MT, true>;
  LILY_CU(cudaLaunchKernelEx(&L.cfg, k, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T,
                             ks, st.x ? nullptr : norm_w, eps, st.x, st.sx));
}

template <int MODE, bool SWI, int MT>
void launch_nf(int nf, dim3 grid, int ks, cudaStream_t s, const Mat& W, int in, int nrows, const float* x, int64_t ldx,
               const int32_t* gather, float* y, int64_t ldy, bool accumulate, int swiglu_I, const int32_t* tiles,
               const int32_t* n_tiles, int T, const float* norm_w, float eps, const RowsStaged& st) {
  if (nf == 1) launch<MODE, 1, SWI, MT>(grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st);
  else if (nf == 2) launch<MODE, 2, SWI, MT>(grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st);
  else launch<MODE, 4, SWI, MT>(grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st);
}

template <int MODE>
void launch_mode(bool swi, int mt, int nf, dim3 grid, int ks, cudaStream_t s, const Mat& W, int in, int nrows,
                 const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy, bool accumulate,
                 int swiglu_I, const int32_t* tiles, const int32_t* n_tiles, int T, const float* norm_w, float eps,
                 const RowsStaged& st) {
  if (swi) launch_nf<MODE, true, 2>(nf, grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st);
  else if (mt == 1) launch_nf<MODE, false, 1>(nf, grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st);
  else launch_nf<MODE, false, 2>(nf, grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st);
}

}  // namespace

bool rows_covers(const Mat& W, int in) {
  if (W.exl3 || in <= 0 || in % 64 != 0) return false;
  if (W.affine)
    return (W.bits == 4 || W.bits == 8) && W.gs % 64 == 0 && (W.gs & (W.gs - 1)) == 0 && W.row_words % 4 == 0 &&
           W.qstride % 4 == 0 && aligned16(W.q);
  return W.ld % 8 == 0 && W.estride % 8 == 0 && aligned16(W.w);
}

bool rows_product(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y,
                  int64_t ldy, bool accumulate, int swiglu_I, const int32_t* tiles, const int32_t* n_tiles,
                  int max_tiles, int T, cudaStream_t s, const float* norm_w, float eps, int x_rows) {
  if (!rows_covers(W, in) || ldx % 4 != 0 || !aligned16(x) || (norm_w && !aligned16(norm_w))) return false;
  if (!tiles && (T < 1 || T > kRowsMax)) return false;
  const int nrows = swiglu_I > 0 ? swiglu_I : out;
  if (nrows <= 0 || (tiles && max_tiles <= 0)) return true;
  const int nf = tiles ? 1 : T <= 8 ? 1 : T <= 16 ? 2 : 4;
  // k split: the fewest warps per row group that give rows_waves blocks per SM (a short tail), from the matrix shape
  // and the number of groups (the live expert tiles are at most the step's slots)
  const bool swi = swiglu_I > 0;
  const int nch = in / 64;
  int rw = swi ? 16 : 32;
  const int64_t groups = tiles ? std::min<int64_t>(max_tiles, T) : 1;
  int ks = 1;
  auto blocks = [&](int k) { return int64_t(cdiv(nrows, int64_t(kWarps / k) * rw)) * groups; };
  const int64_t target = int64_t(kernel_switches().rows_waves) * device_sm_count();
  auto split = [&] {
    ks = 1;
    while (ks < kWarps && blocks(ks) < target && nch / (2 * ks) >= 2) ks *= 2;
  };
  split();
  // a matrix too small for the target even split over every warp: one m16 tile a warp (rows_half), in steps of
  // up to 8 rows (on the H100, 16 streams lost 2% with it)
  int mt = 2;
  if (!swi && kernel_switches().rows_half && T <= 8 && blocks(ks) < target) {
    mt = 1;
    rw = 16;
    split();
  }
  const int64_t gx = cdiv(nrows, int64_t(kWarps / ks) * rw);
  const dim3 grid(unsigned(gx), unsigned(tiles ? max_tiles : 1));
  const int mode = W.affine ? W.bits : 0;
  // the activation rows split once for all blocks (rows_stage.h): the rows x holds, T without a gather
  RowsStaged st;
  const int stage = kernel_switches().rows_stage, src_rows = gather ? x_rows : T;
  if ((tiles ? stage >= 1 : stage >= 2) && src_rows > 0)
    st = rows_stage(mode == 4 ? 4 : 0, x, ldx, in, src_rows, norm_w, eps, s);
  switch (mode) {
    case 0: launch_mode<0>(swi, mt, nf, grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st); break;
    case 4: launch_mode<4>(swi, mt, nf, grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st); break;
    default: launch_mode<8>(swi, mt, nf, grid, ks, s, W, in, nrows, x, ldx, gather, y, ldy, accumulate, swiglu_I, tiles, n_tiles, T, norm_w, eps, st); break;
  }
  LILY_CU_LAUNCH();
  return true;
}

bool rows_linear(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy,
                 bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w, float eps) {
  const KernelSwitches& k = kernel_switches();
  if (T < std::max(3, W.exl3 ? k.rows_min_exl3 : k.rows_min) || T > std::min(k.rows_dense, kRowsMax)) return false;
  if ((swiglu_I > 0 ? swiglu_I : out) < 16) return false;  // a few outputs: the per-row GEMV has more blocks
  if (W.exl3) return swiglu_I == 0 && !norm_w && exl3_rows(W, out, in, x, ldx, T, y, ldy, accumulate, s);
  return rows_product(W, out, in, x, ldx, nullptr, y, ldy, accumulate, swiglu_I, nullptr, nullptr, 0, T, s, norm_w, eps);
}

bool rows_moe_on(int T, bool exl3) {
  const KernelSwitches& k = kernel_switches();
  return T >= std::max(3, exl3 ? k.rows_min_exl3 : k.rows_min) && T <= k.rows_moe;
}

}  // namespace lily::cuda
