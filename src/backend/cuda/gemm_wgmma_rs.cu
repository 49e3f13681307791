// Hopper GEMM for prompt products with the weights dequantised in registers (gemm_wgmma_rs.h):
//   y[r, n] (= or +=) Σ_k x[r, k] · W_e[n, k],  A = W (64 output columns × 16 k per wgmma, from registers),
//   B = the staged input rows (shared memory), fp32 accumulation and output.
//
// Work unit: one tile of <= 128 product rows (an entry of the tile map, or 128 dense rows) × 256 output columns;
// the CTAs (one per SM) walk the units persistently in gemm_wgmma's order. 384 threads:
//   warpgroup 0, the producers. Thread 0 issues each stage's copies S - 1 stages ahead: the rows (128 × 64,
//     128-byte swizzle, from gemm_stage's copy in rs_phys_k order) and the weights of 256 columns × 64 k (codes
//     as stored, 32 or 64 bytes a row; bf16 weights 128-byte swizzled). Warps 1-3 put each column's scale and
//     bias for the stage's two 32-deep halves into shared memory as a 16-bit pair of the operand type (loads
//     from global, so they run ahead like the copies).
//   warpgroups 1 and 2, the consumers: columns 0-127 and 128-255 of the unit, as two 64-column blocks each, over
//     all the unit's rows as the wgmma's N (128, or 64 / 32 for units of fewer rows). Per stage each thread
//     reads its four columns' words (thread c of a warp: physical k 16c .. 16c + 15), then per 16-deep slice
//     dequantises its A fragments in registers — affine: the code pair masked into the mantissa of 128 (bf16)
//     or 1024 (fp16), that constant subtracted (exact), one fma with (s, s) and (b, b) (8-bit bf16: in fp32, the
//     codes under 2^23); bf16 weights: converted to fp16 — and issues the two blocks' wgmmas as one group,
//     keeping one group in flight (the fragments of the slice in flight stay live until its group retires).
// mbarriers per stage: full (the copies' bytes and the producer warps' arrivals), empty (one arrival per
// consumer warp). Needs sm_90a; other passes trap, and gemm_wgmma declines other devices.
#include "backend/cuda/gemm_wgmma_rs.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/gemm_stage.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/wgmma.cuh"

namespace lily::cuda {
namespace {

constexpr int kRows = wg::kUnitRows;  // rows per unit (the wgmma's N at most)
constexpr int kCols = wg::kUnitCols;  // output columns per unit: 2 consumer warpgroups × 2 blocks of 64
constexpr int kBK = wg::kStageK;      // k per stage
constexpr int kThreads = 384;
constexpr int kLoaders = 96;          // producer warps 1-3
constexpr uint32_t kAct = kRows * kBK * 2;  // 16 KB of input rows per stage
static_assert(kRows == kGemmUnitRows, "the tile maps' rows per unit");
constexpr uint32_t kSB = kCols * 2 * 4;     // (scale, bias) per column and half stage: 2 KB

// WB: 4 / 8 affine bits, 16 bf16 weights.
template <int WB>
struct RsCfg {
  static constexpr uint32_t W = uint32_t(kCols) * WB * kBK / 8;  // weight bytes per stage
  static constexpr uint32_t STAGE = kAct + W + (WB == 16 ? 0u : kSB);
  static constexpr int S = 200u * 1024u / STAGE > 8 ? 8 : int(200u * 1024u / STAGE);
  static constexpr size_t SMEM = 1024 + size_t(S) * STAGE + 16 * size_t(S);
  static constexpr int WW = WB / 2;  // words of a column per thread and stage (16 k)
  static_assert(STAGE % 1024 == 0, "operands 1024-aligned");
};

using wg::Args;
using wg::Unit;

#ifdef LILY_WGMMA_CODE
using namespace wg;

#define LILY_WGMMA_RS_N128(TY)                                                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                  \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                                  \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))
#define LILY_WGMMA_RS_N64(TY)                                                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                  \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                  \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))
#define LILY_WGMMA_RS_N32(TY)                                                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                  \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " "                                  \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"                                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))
// d (64 columns × N rows of the unit; thread layout: columns 16·warp + lane/4 (+8), rows 8j + 2·(lane % 4) (+1)
// in d[4j .. 4j+3]) (scale_d: +)= A (64 × 16 from registers a) · B (N × 16, descriptor db)ᵀ.
template <int N, bool F16>
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t* a, uint64_t db, int scale_d) {
  if constexpr (N == 128) {
    if constexpr (F16) LILY_WGMMA_RS_N128("f16");
    else LILY_WGMMA_RS_N128("bf16");
  } else if constexpr (N == 64) {
    if constexpr (F16) LILY_WGMMA_RS_N64("f16");
    else LILY_WGMMA_RS_N64("bf16");
  } else {
    if constexpr (F16) LILY_WGMMA_RS_N32("f16");
    else LILY_WGMMA_RS_N32("bf16");
  }
}
#undef LILY_WGMMA_RS_N128
#undef LILY_WGMMA_RS_N64
#undef LILY_WGMMA_RS_N32

// A fragment register from a code pair (rs_code_pair) and the column's (scale | bias << 16) in the operand type.
template <int WB, bool F16>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t codes, uint32_t sb) {
  if constexpr (WB == 16) {  // bf16 pair -> fp16 pair
    const __half2 h = __floats2half2_rn(__uint_as_float(codes << 16), __uint_as_float(codes & 0xFFFF0000u));
    return *reinterpret_cast<const uint32_t*>(&h);
  } else if constexpr (WB == 8 && !F16) {  // 8-bit codes do not fit bf16's mantissa: fp32, rounded once to bf16
    const float s = __uint_as_float(sb << 16), b = __uint_as_float(sb & 0xFFFF0000u);
    const float q0 = __uint_as_float(0x4B000000u | (codes & 0xFFu)) - 8388608.f;
    const float q1 = __uint_as_float(0x4B000000u | (codes >> 16)) - 8388608.f;
    const __nv_bfloat162 v = __floats2bfloat162_rn(fmaf(q0, s, b), fmaf(q1, s, b));
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const uint32_t s2 = __byte_perm(sb, 0u, 0x1010u), b2 = __byte_perm(sb, 0u, 0x3232u);
    constexpr uint32_t kMagic = F16 ? 0x64006400u : 0x43004300u;  // (1024, 1024) / (128, 128)
    const uint32_t t = codes | kMagic;
    uint32_t r;
    if constexpr (F16) {
      const __half2 q = __hsub2(*reinterpret_cast<const __half2*>(&t), *reinterpret_cast<const __half2*>(&kMagic));
      const __half2 v = __hfma2(q, *reinterpret_cast<const __half2*>(&s2), *reinterpret_cast<const __half2*>(&b2));
      r = *reinterpret_cast<const uint32_t*>(&v);
    } else {
      const __nv_bfloat162 q =
          __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&t), *reinterpret_cast<const __nv_bfloat162*>(&kMagic));
      const __nv_bfloat162 v = __hfma2(q, *reinterpret_cast<const __nv_bfloat162*>(&s2),
                                       *reinterpret_cast<const __nv_bfloat162*>(&b2));
      r = *reinterpret_cast<const uint32_t*>(&v);
    }
    return r;
  }
}

// One unit on a consumer warpgroup (cw) with the wgmma's N rows: the stages j.. j + nk - 1 of the ring, then the
// epilogue. fa: the A fragments of two slices ([slice parity][block · 4 + register]).
template <int WB, bool F16, int N>
__device__ __forceinline__ void rs_unit(const Args& a, const Unit& un, int nk, int& j, unsigned char* sm,
                                        uint32_t base, uint32_t full, uint32_t empty, int cw, float (&acc)[2][64],
                                        uint32_t (&fa)[2][8]) {
  using C = RsCfg<WB>;
  const int tid = threadIdx.x, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int cl0 = 128 * cw + 16 * warp + g;  // column (within the unit) of block 0, fragment rows 0-7
  for (int kt = 0; kt < nk; ++kt, ++j) {
    const int slot = j % C::S;
    bar_wait(full + 8 * slot, (j / C::S) & 1);
    const unsigned char* st = sm + size_t(slot) * C::STAGE;
    const unsigned char* wt = st + kAct;
    uint32_t w[2][2][C::WW];  // [block][fragment row half][words]
    uint32_t sb[2][2] = {};
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int cl = cl0 + 64 * b + 8 * h;
        if constexpr (WB == 4) {
          const uint2 v = *reinterpret_cast<const uint2*>(wt + cl * 32 + 8 * c);
          w[b][h][0] = v.x;
          w[b][h][1] = v.y;
        } else if constexpr (WB == 8) {
          const uint4 v = *reinterpret_cast<const uint4*>(wt + cl * 64 + 16 * c);
          w[b][h][0] = v.x; w[b][h][1] = v.y; w[b][h][2] = v.z; w[b][h][3] = v.w;
        } else {
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const uint4 v = *reinterpret_cast<const uint4*>(wt + sw128(cl, 2 * c + hh));
            w[b][h][4 * hh] = v.x; w[b][h][4 * hh + 1] = v.y; w[b][h][4 * hh + 2] = v.z; w[b][h][4 * hh + 3] = v.w;
          }
        }
        if constexpr (WB != 16) sb[b][h] = reinterpret_cast<const uint32_t*>(wt + C::W)[2 * cl + (c >> 1)];
      }
    const uint64_t db = desc_sw128(base + uint32_t(slot) * C::STAGE);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t(&A)[8] = fa[s & 1];
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int r = 0; r < 4; ++r)  // register r: fragment row half r & 1, k half r >> 1
          A[4 * b + r] = dequant_pair<WB, F16>(rs_code_pair(WB, w[b][r & 1], s, r >> 1), sb[b][r & 1]);
      fence_regs(A);
      fence_regs(acc[0]);
      fence_regs(acc[1]);
      fence();
      wgmma_rs<N, F16>(acc[0], A, db + 2 * s, (kt | s) != 0);
      wgmma_rs<N, F16>(acc[1], A + 4, db + 2 * s, (kt | s) != 0);
      commit();
      wait<1>();  // the previous slice's group has retired: its fragments and, at s == 0, the previous stage
      fence_regs(acc[0]);
      fence_regs(acc[1]);
      fence_regs(fa[(s + 1) & 1]);
      if (s == 0) bar_arrive_if(empty + 8 * ((j + C::S - 1) % C::S), lane == 0 && kt > 0);
    }
  }
  wait<0>();
  fence_regs(acc[0]);
  fence_regs(acc[1]);
  bar_arrive_if(empty + 8 * ((j + C::S - 1) % C::S), lane == 0);
  // epilogue: rows row0 + 8jj + 2c (+1), columns nb·256 + cl0 + 64b (+8)
  const int col0 = un.nb * kCols + cl0;
#pragma unroll
  for (int jj = 0; jj < N / 8; ++jj)
#pragma unroll
    for (int v0 = 0; v0 < 2; ++v0) {
      const int r = 8 * jj + 2 * c + v0;
      if (r >= un.nrows) continue;
      const int row = un.row0 + r;
      float* yr = a.y + int64_t(row) * a.ldy;
      const float inv = F16 ? __frcp_rn(a.scales[row]) : 1.f;  // exact: a power of two
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int v1 = 0; v1 < 2; ++v1) {
          const int col = col0 + 64 * b + 8 * v1;
          if (col >= a.out) continue;
          const float v = acc[b][4 * jj + 2 * v1 + v0] * inv;
          yr[col] = a.accumulate ? yr[col] + v : v;
        }
    }
}
#endif

template <int WB, bool F16>
__global__ void __launch_bounds__(kThreads, 1) gemm_wgmma_rs_kernel(const __grid_constant__ CUtensorMap tmA,
                                                                    const __grid_constant__ CUtensorMap tmW,
                                                                    const Args a) {
#ifdef LILY_WGMMA_CODE
  using C = RsCfg<WB>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sm = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t base = smem_u32(sm);
  const uint32_t full = base + C::S * C::STAGE, empty = full + 8 * C::S;
  const int tid = threadIdx.x, wgi = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  if (tid == 0) {
    for (int i = 0; i < C::S; ++i) {
      bar_init(full + 8 * i, 1 + (WB == 16 ? 0 : kLoaders));  // the copy thread (+ the scale loaders)
      bar_init(empty + 8 * i, 8);                              // one per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();

  const wg::UnitWalk unit(a.out, a.in, a.T, a.tiles, a.n_tiles, a.raster);
  const int nk = unit.nk, n_units = unit.n_units, n_stages = n_units * nk;

  if (wgi == 0) {
    // ---------------- producers ----------------
    reg_dealloc<40>();
    if (warp == 0) {
      if (lane == 0) {
        Unit un{};
        for (int j = 0; j < n_stages; ++j) {
          const int slot = j % C::S, kt = j % nk;
          if (kt == 0) un = unit(j / nk);
          bar_wait(empty + 8 * slot, ((j / C::S) & 1) ^ 1);
          const uint32_t f = full + 8 * slot, dst = base + uint32_t(slot) * C::STAGE;
          bar_arrive_tx(f, kAct + C::W);
          tma_2d(dst, &tmA, kt * kBK, un.row0, f);
          tma_3d(dst + kAct, &tmW, kt * (WB == 16 ? kBK : rs_row_words(WB)), un.nb * kCols, un.e, f);
        }
      }
    } else if constexpr (WB != 16) {
      // (column n, half h): the group of k = 64·kt + 32h, as (scale | bias << 16) in the operand type
      const int t = tid - 32;
      Unit un{};
      for (int j = 0; j < n_stages; ++j) {
        const int slot = j % C::S, kt = j % nk;
        if (kt == 0) un = unit(j / nk);
        const int64_t ebase = int64_t(un.e) * a.sstride;
        uint32_t v[6];
#pragma unroll
        for (int i = 0; i < 6; ++i) {  // loads first, all in flight at once
          const int idx = t + kLoaders * i, n = idx >> 1, col = un.nb * kCols + n, k = kt * kBK + 32 * (idx & 1);
          v[i] = 0;
          if (idx < 2 * kCols && col < a.out && k < a.in) {
            const int64_t gi = ebase + int64_t(col) * a.ngroups + k / a.gs;
            const uint32_t sv = __ldg(a.s + gi), bv = __ldg(a.b + gi);
            if constexpr (F16) {
              const __half2 h = __floats2half2_rn(__uint_as_float(sv << 16), __uint_as_float(bv << 16));
              v[i] = *reinterpret_cast<const uint32_t*>(&h);
            } else {
              v[i] = sv | (bv << 16);
            }
          }
        }
        bar_wait(empty + 8 * slot, ((j / C::S) & 1) ^ 1);
        uint32_t* sb = reinterpret_cast<uint32_t*>(sm + size_t(slot) * C::STAGE + kAct + C::W);
#pragma unroll
        for (int i = 0; i < 6; ++i)
          if (t + kLoaders * i < 2 * kCols) sb[t + kLoaders * i] = v[i];
        bar_arrive(full + 8 * slot);
      }
    }
  } else {
    // ---------------- consumers ----------------
    reg_alloc<232>();
    const int cw = wgi - 1;
    float acc[2][64];
    uint32_t fa[2][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) fa[0][i] = fa[1][i] = 0u;
    int j = 0;
    for (int u = 0; u < n_units; ++u) {
      const Unit un = unit(u);  // uniform over the CTA: the wgmma's N by the unit's rows
      if (un.nrows > 64) rs_unit<WB, F16, 128>(a, un, nk, j, sm, base, full, empty, cw, acc, fa);
      else if (un.nrows > 32) rs_unit<WB, F16, 64>(a, un, nk, j, sm, base, full, empty, cw, acc, fa);
      else rs_unit<WB, F16, 32>(a, un, nk, j, sm, base, full, empty, cw, acc, fa);
    }
  }
#else
  (void)kLoaders;  // the sm_80 pass of this file compiles no body
  (void)RsCfg<WB>::WW;
  __trap();
#endif
}

template <int WB, bool F16>
void raise_smem() {
  LILY_CU(cudaFuncSetAttribute(gemm_wgmma_rs_kernel<WB, F16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(RsCfg<WB>::SMEM)));
}

template <int WB, bool F16>
void launch(unsigned grid, const CUtensorMap& ma, const CUtensorMap& mw, const Args& a, cudaStream_t s) {
  gemm_wgmma_rs_kernel<WB, F16><<<grid, kThreads, RsCfg<WB>::SMEM, s>>>(ma, mw, a);
}

}  // namespace

void init_gemm_wgmma_rs_kernels() {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  LILY_CU(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (done.load() & bit) return;
  raise_smem<4, false>(); raise_smem<4, true>();
  raise_smem<8, false>(); raise_smem<8, true>();
  raise_smem<16, true>();
  done.fetch_or(bit);
}

void gemm_wgmma_rs(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y,
                   int64_t ldy, bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T,
                   GemmPrec prec, int sms, cudaStream_t s) {
  if (!gemm_wgmma_rs_covers(W, prec)) fail_internal("gemm_wgmma_rs: neither affine weights nor the fp16 mode");
  init_gemm_wgmma_rs_kernels();
  const bool f16 = prec == GemmPrec::kFp16;
  const int wb = W.affine ? W.bits : 16;
  const StagedRows st = stage_rows(f16, x, ldx, in, gather, tiles, n_tiles, max_tiles, T, s, wb);
  CUtensorMap ma{}, mw{};
  const uint64_t da[2] = {uint64_t(st.ld), uint64_t(T)}, sa[1] = {uint64_t(st.ld) * 2};
  bool ok = wg::make_map(ma, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, st.a, 2, da, sa,
                         kBK, kRows, CU_TENSOR_MAP_SWIZZLE_128B);
  const uint64_t experts = tiles ? 65536 : 1;  // any index the tile map names
  if (!W.affine) {
    const uint64_t es = tiles ? uint64_t(W.estride) : uint64_t(out) * uint64_t(W.ld);
    const uint64_t dw[3] = {uint64_t(in), uint64_t(out), experts};
    const uint64_t sw[2] = {uint64_t(W.ld) * 2, std::max<uint64_t>(es, uint64_t(out) * uint64_t(W.ld)) * 2};
    ok = ok && wg::make_map(mw, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, W.w, 3, dw, sw, kBK, kCols, CU_TENSOR_MAP_SWIZZLE_128B);
  } else {
    const uint64_t qs = tiles ? uint64_t(W.qstride) : uint64_t(out) * uint64_t(W.row_words);
    const uint64_t dw[3] = {uint64_t(W.row_words), uint64_t(out), experts};
    const uint64_t sw[2] = {uint64_t(W.row_words) * 4, std::max<uint64_t>(qs, uint64_t(out) * uint64_t(W.row_words)) * 4};
    ok = ok && wg::make_map(mw, CU_TENSOR_MAP_DATA_TYPE_UINT32, W.q, 3, dw, sw, uint32_t(rs_row_words(W.bits)), kCols,
                            CU_TENSOR_MAP_SWIZZLE_NONE);
  }
  if (!ok) fail_internal("gemm_wgmma_rs: a tensor map of a covered shape was refused");
  Args a{};
  a.out = out; a.in = in; a.T = T; a.y = y; a.ldy = ldy; a.accumulate = accumulate;
  a.tiles = tiles; a.n_tiles = n_tiles; a.scales = st.s;
  a.s = W.s; a.b = W.b; a.sstride = W.sstride; a.gs = W.affine ? W.gs : 1; a.ngroups = W.affine ? in / W.gs : 0;
  a.raster = kernel_switches().wgmma_raster;
  const unsigned grid = wg::unit_grid(tiles ? max_tiles : 0, T, out, sms);
  if (wb == 4) f16 ? launch<4, true>(grid, ma, mw, a, s) : launch<4, false>(grid, ma, mw, a, s);
  else if (wb == 8) f16 ? launch<8, true>(grid, ma, mw, a, s) : launch<8, false>(grid, ma, mw, a, s);
  else launch<16, true>(grid, ma, mw, a, s);
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
