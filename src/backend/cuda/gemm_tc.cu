// Tensor-core GEMM for prompt products: y[r, 0:out] (= or +=) x[gather[r], 0:in] · Wᵀ.
//
// Block tile BM rows x 128 output columns x 64 in-elements per k-step, 256 threads = 8 warps laid out
// 2 (rows) x 4 (columns); each warp owns BM/2 x 32 outputs as (BM/32) x 4 mma.sync m16n8k16 tiles.
// Shared memory holds two stages of { A: BM x 64 16-bit (hi, and lo when split), B: 128 x 64 16-bit (hi, and
// lo for split affine) }, rows padded to 72 elements (144 bytes) so that ldmatrix and the staging stores are
// free of bank conflicts. Per k-step: the next tile's fp32 activations (and affine codes, or fp16-mode bf16
// weights) are loaded into registers and bf16 weights copied with cp.async into the other stage while the
// tensor cores work on the current one; then the registers are converted (fp32 -> bf16 or scaled fp16,
// codes -> s·q + b, bf16 -> fp16) into that stage. fp16 mode: input row r is multiplied by its power of two
// (row_scales.h) before the fp16 rounding, its outputs by the inverse in the epilogue.
// Dense products use BM = 128 (grid x over row tiles, so the blocks in flight share weight columns);
// expert tile maps use BM = kGemmBM = 64 (grid x over column tiles of the same expert tile).
#include <cuda_fp16.h>

#include <atomic>
#include <type_traits>

#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/gemm_stage.h"

namespace lily::cuda {
namespace {

constexpr int kBN = 128;
constexpr int kBK = 64;
constexpr int kLds = kBK + 8;  // shared row stride in bf16 elements
constexpr int kThreads = 256;
static_assert(kGemmBM == 64, "the tile-map instantiation assumes tiles of at most 64 rows");

// Operand modes (GemmPrec): bf16, split bf16 hi + lo, fp16 with per-row scales.
enum Mode : int { kModeBf16 = 0, kModeSplit = 1, kModeFp16 = 2 };

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// (v0, v1) -> packed bf16 pair hi (v0 in the low half) and the pair of remainders lo = bf16(v - hi).
__device__ __forceinline__ void split2(float v0, float v1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat16 h0 = __float2bfloat16_rn(v0), h1 = __float2bfloat16_rn(v1);
  const __nv_bfloat16 l0 = __float2bfloat16_rn(v0 - __bfloat162float(h0));
  const __nv_bfloat16 l1 = __float2bfloat16_rn(v1 - __bfloat162float(h1));
  hi = uint32_t(__bfloat16_as_ushort(h0)) | (uint32_t(__bfloat16_as_ushort(h1)) << 16);
  lo = uint32_t(__bfloat16_as_ushort(l0)) | (uint32_t(__bfloat16_as_ushort(l1)) << 16);
}

template <int WB, int MODE, int BM>
struct Cfg {
  static constexpr bool SPLIT = MODE == kModeSplit;
  static constexpr bool F16 = MODE == kModeFp16;
  static constexpr bool B_RAW = F16 && WB == 0;            // bf16 weights staged raw, converted to fp16
  static constexpr int NA = SPLIT ? 2 : 1;                // A planes (hi, lo)
  static constexpr int NB = (SPLIT && WB != 0) ? 2 : 1;   // B planes (bf16 weights are exact: hi only)
  static constexpr int A_ELEMS = BM * kLds;
  static constexpr int B_ELEMS = kBN * kLds;
  static constexpr int STAGE = NA * A_ELEMS + NB * B_ELEMS;
  static constexpr int RAW = B_RAW ? kBN * kLds : 0;        // the raw bf16 weights of the next stage
  static constexpr size_t SMEM = (2 * size_t(STAGE) + RAW) * sizeof(uint16_t);
  static constexpr int MT = BM / 32;                      // m16 tiles per warp
  static constexpr int A_PER = BM * (kBK / 4) / kThreads;  // float4 of activations staged per thread
  static constexpr int B_PER = kBN * kBK / 8 / kThreads;   // 16-byte weight chunks staged per thread
};

// WB: 0 bf16 weights, 4 / 8 affine bits. MODE: see Mode. BM: rows per block tile. rs: the fp16 mode's row scales.
template <int WB, int MODE, int BM>
__global__ void __launch_bounds__(kThreads) gemm_tc_kernel(const Mat W, int out, int in, const float* __restrict__ x,
    int64_t ldx, const int32_t* __restrict__ gather, float* __restrict__ y, int64_t ldy, bool accumulate,
    const int32_t* __restrict__ tiles, const int32_t* __restrict__ n_tiles, int T, bool skip_empty, const RowScales rs) {
  using C = Cfg<WB, MODE, BM>;
  constexpr bool SPLIT = C::SPLIT;
  extern __shared__ __align__(16) uint16_t smem[];
  __shared__ int rows_src[BM];
  __shared__ float rows_scale[C::F16 ? BM : 1];

  const int tile = tiles ? blockIdx.y : blockIdx.x;
  const int n0 = (tiles ? blockIdx.x : blockIdx.y) * kBN;
  int e, row0, nrows;
  if (!tile_rows(tiles, n_tiles, tile, T, BM, e, row0, nrows)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  for (int i = tid; i < BM; i += kThreads) {
    const int src = i < nrows ? (gather ? gather[row0 + i] : row0 + i) : -1;
    rows_src[i] = src;
    if constexpr (C::F16) rows_scale[i] = src >= 0 ? row_scale_of(rs, src, row0 + i) : 1.f;
  }
  __syncthreads();

  // ---- staging: activations (fp32 -> bf16 hi/lo, or scaled fp16) ----
  float4 areg[C::A_PER];
  auto load_a = [&](int k0) {
#pragma unroll
    for (int i = 0; i < C::A_PER; ++i) {
      const int idx = tid + kThreads * i, r = idx >> 4, k = k0 + ((idx & 15) << 2);
      const int src = rows_src[r];
      areg[i] = (src >= 0 && k < in) ? __ldg(reinterpret_cast<const float4*>(x + int64_t(src) * ldx + k))
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  auto store_a = [&](uint16_t* st) {
#pragma unroll
    for (int i = 0; i < C::A_PER; ++i) {
      const int idx = tid + kThreads * i, r = idx >> 4, kk = (idx & 15) << 2;
      if constexpr (C::F16) {
        const float sc = rows_scale[r];
        *reinterpret_cast<uint2*>(st + r * kLds + kk) =
            make_uint2(pack_f16x2(areg[i].x * sc, areg[i].y * sc), pack_f16x2(areg[i].z * sc, areg[i].w * sc));
      } else {
        uint32_t h0, h1, l0, l1;
        split2(areg[i].x, areg[i].y, h0, l0);
        split2(areg[i].z, areg[i].w, h1, l1);
        *reinterpret_cast<uint2*>(st + r * kLds + kk) = make_uint2(h0, h1);
        if constexpr (SPLIT) *reinterpret_cast<uint2*>(st + C::A_ELEMS + r * kLds + kk) = make_uint2(l0, l1);
      }
    }
  };

  // ---- staging: bf16 weights by cp.async (rows past `out` or k past `in` are zero-filled) ----
  auto issue_b_bf16 = [&](uint16_t* bs, int k0) {
    const uint16_t* wb = W.w + int64_t(e) * W.estride;
#pragma unroll
    for (int i = 0; i < C::B_PER; ++i) {
      const int idx = tid + kThreads * i, n = idx >> 3, kk = (idx & 7) << 3;
      const bool ok = n0 + n < out && k0 + kk < in;
      cp_async16(smem_u32(bs + n * kLds + kk), ok ? wb + int64_t(n0 + n) * W.ld + k0 + kk : W.w, ok);
    }
  };
  // fp16 mode: the same chunks copied into the raw buffer, then each thread converts its own chunks
  // bf16 -> fp16 (exact from 2^-17 to 65,504) into the stage
  uint16_t* raw = smem + 2 * C::STAGE;
  auto convert_b_bf16 = [&](uint16_t* st) {
    uint16_t* bs = st + C::NA * C::A_ELEMS;
    cp_async_wait_all();
#pragma unroll
    for (int i = 0; i < C::B_PER; ++i) {
      const int idx = tid + kThreads * i, n = idx >> 3, kk = (idx & 7) << 3;
      float f[8];
      bf8(*reinterpret_cast<const uint4*>(raw + n * kLds + kk), f);
      *reinterpret_cast<uint4*>(bs + n * kLds + kk) =
          make_uint4(pack_f16x2(f[0], f[1]), pack_f16x2(f[2], f[3]), pack_f16x2(f[4], f[5]), pack_f16x2(f[6], f[7]));
    }
  };

  // ---- staging: affine codes; thread t holds row t/2, in-elements [k0 + 32 (t % 2), +32): one group ----
  constexpr int QW = WB == 8 ? 8 : 4;  // uint32 words of 32 codes
  uint32_t qreg[QW] = {};
  uint16_t sreg = 0, breg = 0;
  bool bok = false;
  auto load_b_aff = [&](int k0) {
    const int n = tid >> 1, k = k0 + ((tid & 1) << 5);
    bok = n0 + n < out && k < in;
    if (bok) {
      const uint4* q4 = reinterpret_cast<const uint4*>(W.q + int64_t(e) * W.qstride + int64_t(n0 + n) * W.row_words +
                                                       ((k * WB) >> 5));
#pragma unroll
      for (int j = 0; j < QW / 4; ++j) {
        const uint4 v = __ldg(q4 + j);
        qreg[4 * j] = v.x; qreg[4 * j + 1] = v.y; qreg[4 * j + 2] = v.z; qreg[4 * j + 3] = v.w;
      }
      const int64_t gi = int64_t(e) * W.sstride + int64_t(n0 + n) * (in / W.gs) + k / W.gs;
      sreg = W.s[gi]; breg = W.b[gi];
    }
  };
  auto store_b_aff = [&](uint16_t* st) {
    uint16_t* dst = st + C::NA * C::A_ELEMS + (tid >> 1) * kLds + ((tid & 1) << 5);
    const float sc = bf(sreg), bi = bf(breg);
    uint32_t hi[16], lo[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float v[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int c = 2 * j + u;
        uint32_t code;
        if constexpr (WB == 8) code = (qreg[c >> 2] >> ((c & 3) * 8)) & 255u;
        else code = (qreg[c >> 3] >> ((c & 7) * 4)) & 15u;
        v[u] = bok ? sc * float(code) + bi : 0.f;
      }
      if constexpr (C::F16) hi[j] = pack_f16x2(v[0], v[1]);
      else split2(v[0], v[1], hi[j], lo[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      reinterpret_cast<uint4*>(dst)[j] = make_uint4(hi[4 * j], hi[4 * j + 1], hi[4 * j + 2], hi[4 * j + 3]);
      if constexpr (C::NB == 2)
        reinterpret_cast<uint4*>(dst + C::B_ELEMS)[j] = make_uint4(lo[4 * j], lo[4 * j + 1], lo[4 * j + 2], lo[4 * j + 3]);
    }
  };

  // ---- tensor-core step over one staged k-tile ----
  float acc[C::MT][4][4];
#pragma unroll
  for (int i = 0; i < C::MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.f;
  // MTL: m16 tiles of this warp computed (the others hold no live row of a partial expert tile)
  auto compute = [&](const uint16_t* st, auto mtl) {
    constexpr int MTL = decltype(mtl)::value;
    const uint16_t* as = st + (wm * (BM / 2) + (lane & 15)) * kLds + ((lane >> 4) << 3);
    const uint16_t* bs = st + C::NA * C::A_ELEMS + (wn * 32 + (lane & 7) + ((lane >> 4) << 3)) * kLds + (((lane >> 3) & 1) << 3);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t a[C::NA][C::MT][4], b[C::NB][4][2];
#pragma unroll
      for (int p = 0; p < C::NA; ++p)
#pragma unroll
        for (int mt = 0; mt < MTL; ++mt) ldsm_x4(a[p][mt], smem_u32(as + p * C::A_ELEMS + mt * 16 * kLds + ks * 16));
#pragma unroll
      for (int p = 0; p < C::NB; ++p)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t r[4];
          ldsm_x4(r, smem_u32(bs + p * C::B_ELEMS + j * 16 * kLds + ks * 16));
          b[p][2 * j][0] = r[0]; b[p][2 * j][1] = r[1];
          b[p][2 * j + 1][0] = r[2]; b[p][2 * j + 1][1] = r[3];
        }
#pragma unroll
      for (int mt = 0; mt < MTL; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          if constexpr (SPLIT) mma_bf16(acc[mt][nt], a[C::NA - 1][mt], b[0][nt][0], b[0][nt][1]);  // x_lo · w_hi
          if constexpr (C::NB == 2) mma_bf16(acc[mt][nt], a[0][mt], b[1][nt][0], b[1][nt][1]);     // x_hi · w_lo
          if constexpr (C::F16) mma_f16(acc[mt][nt], a[0][mt], b[0][nt][0], b[0][nt][1]);
          else mma_bf16(acc[mt][nt], a[0][mt], b[0][nt][0], b[0][nt][1]);
        }
    }
  };

  // ---- main loop: two stages, one barrier per k-tile ----
  const int nk = (in + kBK - 1) / kBK;
  auto load_b = [&](uint16_t* st, int k0) {
    if constexpr (C::B_RAW) issue_b_bf16(raw, k0);
    else if constexpr (WB == 0) issue_b_bf16(st + C::NA * C::A_ELEMS, k0);
    else load_b_aff(k0);
  };
  auto store_b = [&](uint16_t* st) {
    if constexpr (C::B_RAW) convert_b_bf16(st);
    else if constexpr (WB != 0) store_b_aff(st);
  };
  load_a(0);
  load_b(smem, 0);
  store_a(smem);
  store_b(smem);
  cp_async_wait_all();
  __syncthreads();
  for (int kt = 0; kt < nk; ++kt) {
    uint16_t* cur = smem + (kt & 1) * C::STAGE;
    uint16_t* nxt = smem + ((kt + 1) & 1) * C::STAGE;
    const bool more = kt + 1 < nk;
    if (more) {
      load_a((kt + 1) * kBK);
      load_b(nxt, (kt + 1) * kBK);
    }
    if constexpr (BM == 64) {  // expert tiles: a warp whose upper (or every) m16 tile is empty skips its MMAs
      const int live_mt = skip_empty ? (nrows - wm * (BM / 2) + 15) / 16 : C::MT;
      if (live_mt >= C::MT) compute(cur, std::integral_constant<int, C::MT>{});
      else if (live_mt == 1) compute(cur, std::integral_constant<int, 1>{});
    } else {
      compute(cur, std::integral_constant<int, C::MT>{});
    }
    if (more) {
      store_a(nxt);
      store_b(nxt);
      cp_async_wait_all();
    }
    __syncthreads();
  }

  // ---- epilogue: c0,c1 at (row g, cols 2q, 2q+1), c2,c3 at row g + 8 ----
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * (BM / 2) + mt * 16 + (lane >> 2) + 8 * h;
      if (r >= nrows) continue;
      float* yr = y + int64_t(row0 + r) * ldy;
      const float inv = C::F16 ? __frcp_rn(rows_scale[r]) : 1.f;  // exact: a power of two
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = n0 + wn * 32 + nt * 8 + ((lane & 3) << 1);
#pragma unroll
        for (int j = 0; j < 2; ++j)
          if (c + j < out) {
            const float v = C::F16 ? acc[mt][nt][2 * h + j] * inv : acc[mt][nt][2 * h + j];
            yr[c + j] = accumulate ? yr[c + j] + v : v;
          }
      }
    }
}


// Raises the kernel's dynamic shared-memory limit on the current device, once per device (bit d of `raised`):
// from init_kernels before any capture, and again lazily for callers that skipped it (tests).
template <int WB, int MODE, int BM>
void raise_smem() {
  static std::atomic<uint64_t> raised{0};
  int dev = 0;
  LILY_CU(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (raised.load() & bit) return;
  LILY_CU(cudaFuncSetAttribute(gemm_tc_kernel<WB, MODE, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(Cfg<WB, MODE, BM>::SMEM)));
  raised.fetch_or(bit);
}

template <int WB>
void raise_smem_all() {
  raise_smem<WB, kModeBf16, 64>(); raise_smem<WB, kModeBf16, 128>();
  raise_smem<WB, kModeSplit, 64>(); raise_smem<WB, kModeSplit, 128>();
  raise_smem<WB, kModeFp16, 64>(); raise_smem<WB, kModeFp16, 128>();
}

struct Args {
  const Mat& W;
  int out, in;
  const float* x;
  int64_t ldx;
  const int32_t* gather;
  float* y;
  int64_t ldy;
  bool accumulate;
  const int32_t* tiles;
  const int32_t* n_tiles;
  int max_tiles, T;
  RowScales rs;
  cudaStream_t s;
};

template <int WB, int MODE, int BM>
void launch(const Args& a) {
  using C = Cfg<WB, MODE, BM>;
  raise_smem<WB, MODE, BM>();
  const dim3 grid = a.tiles ? dim3(cdiv(a.out, kBN), unsigned(a.max_tiles)) : dim3(cdiv(a.T, BM), cdiv(a.out, kBN));
  const bool skip = kernel_switches().gemm_skip_empty;
  gemm_tc_kernel<WB, MODE, BM><<<grid, kThreads, C::SMEM, a.s>>>(a.W, a.out, a.in, a.x, a.ldx, a.gather, a.y, a.ldy,
                                                                  a.accumulate, a.tiles, a.n_tiles, a.T, skip, a.rs);
  LILY_CU_LAUNCH();
}

template <int WB, int MODE>
void launch_rows(const Args& a) {
  if (a.tiles || a.T < 128) launch<WB, MODE, 64>(a);
  else launch<WB, MODE, 128>(a);
}

template <int WB>
void launch_prec(GemmPrec prec, const Args& a) {
  if (prec == GemmPrec::kSplit) launch_rows<WB, kModeSplit>(a);
  else if (prec == GemmPrec::kFp16) launch_rows<WB, kModeFp16>(a);
  else launch_rows<WB, kModeBf16>(a);
}

}  // namespace

void init_gemm_tc_kernels() {
  raise_smem_all<0>();
  raise_smem_all<4>();
  raise_smem_all<8>();
}

GemmPrec gemm_prec_for(const Mat& W) {
  const KernelSwitches& k = kernel_switches();
  if (k.gemm_prec == GemmPrec::kSplit || !(W.cls & k.reduced_classes)) return GemmPrec::kSplit;
  return k.gemm_prec;
}

bool gemm_tc(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
             bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, GemmPrec prec,
             cudaStream_t s, int x_rows) {
  if (in <= 0 || in % 32 != 0 || ldx % 4 != 0 || !aligned16(x)) return false;
  if (W.affine) {
    if ((W.bits != 4 && W.bits != 8) || W.gs <= 0 || W.gs % 32 != 0 || in % W.gs != 0 || W.row_words % 4 != 0 ||
        W.qstride % 4 != 0 || !aligned16(W.q))
      return false;
  } else if (W.ld % 8 != 0 || W.estride % 8 != 0 || !aligned16(W.w)) {
    return false;
  }
  if (max_tiles <= 0 || out <= 0 || (!tiles && T <= 0)) return true;
  RowScales rs;
  if (prec == GemmPrec::kFp16) rs = row_scales(x, ldx, in, gather, tiles, n_tiles, max_tiles, T, x_rows, s);
  const Args a{W, out, in, x, ldx, gather, y, ldy, accumulate, tiles, n_tiles, max_tiles, T, rs, s};
  if (!W.affine) launch_prec<0>(prec, a);
  else if (W.bits == 4) launch_prec<4>(prec, a);
  else launch_prec<8>(prec, a);
  return true;
}

}  // namespace lily::cuda
