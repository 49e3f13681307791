// Prompt (prefill) attention on the tensor cores, flash-attention-2 style.
//
// Block = one KV head × 64 packed query rows (row r: token r / G, query head h·G + r % G) × one key split;
// 4 warps, each owning 16 rows. The G query heads of a KV head share every K/V tile staged in shared
// memory. Per key tile of KT = 64 keys:
//   S = Q Kᵀ   mma.sync m16n8k16 bf16 → fp32; Q (bf16, converted once from the fp32 scratch) and K tiles
//              read with ldmatrix;
//   online softmax in fp32 registers (row max and sum over the 4 lanes of a quad), causal/range masking
//              only on tiles that reach past the first row's last visible key or the split end;
//   O += P V   P re-packed from the S accumulators straight into A fragments (bf16), V read with
//              ldmatrix.trans; O (16 rows × HD per warp) stays in fp32 registers.
// K and V tiles are loaded by cp.async into single buffers with staggered issue: V(j) streams in while
// S(j) is computed, K(j+1) while O += P V(j). Shared-memory rows are padded by 16 bytes (stride HD + 8
// bf16) so the 8 row addresses of an ldmatrix phase fall in 8 distinct 16-byte bank groups.
// Blocks are issued latest-token tiles first (they have the most keys) to shorten the causal tail.
#include "backend/cuda/attn_prefill.h"

#include <atomic>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ptx.cuh"

namespace lily::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kKeys = 64;
std::atomic<bool> g_simt{false};


// Two floats → packed bf16 pair, lo in the low half (the lower column of an mma fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int HD>
constexpr size_t prefill_smem() {
  return sizeof(uint16_t) * size_t(kPrefillRows + 2 * kKeys) * (HD + 8);
}

template <int HD>
__global__ void __launch_bounds__(kThreads, HD == 256 ? 2 : HD == 128 ? 3 : 4) attn_prefill_kernel(
    const float* __restrict__ q, const float* __restrict__ proj, int64_t ldp, int T, int Hq, int Hkv,
    const int64_t* __restrict__ pos, const uint16_t* __restrict__ kc, const uint16_t* __restrict__ vc, int64_t cap,
    int nsplit, float* __restrict__ out, float* __restrict__ po, float* __restrict__ pm, float* __restrict__ pl) {
  constexpr int LD = HD + 8, BQ = kPrefillRows, KT = kKeys;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* Qs = smem;           // [BQ][LD]
  uint16_t* Ks = Qs + BQ * LD;   // [KT][LD]
  uint16_t* Vs = Ks + KT * LD;   // [KT][LD]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;  // mma fragment row (and row + 8) and column pair
  const int h = blockIdx.y, split = blockIdx.z;
  const int G = Hq / Hkv, R = G * T;
  const int r0 = int(gridDim.x - 1 - blockIdx.x) * BQ;
  const int64_t p0 = *pos, N = p0 + T;
  const int last_row = min(R, r0 + BQ) - 1;
  const int64_t kmax = p0 + last_row / G + 1;  // keys [0, kmax) are seen by some row of the tile
  const int64_t kfull = p0 + r0 / G + 1;       // keys [0, kfull) are seen by every row
  const int64_t chunk = (N + nsplit - 1) / nsplit;
  const int64_t kb = int64_t(split) * chunk;
  const int64_t ke = min(min(N, kb + chunk), kmax);
  const uint16_t* kh = kc + int64_t(h) * cap * HD;
  const uint16_t* vh = vc + int64_t(h) * cap * HD;

  // KT rows of keys from k0 (rows at or past ke zero-filled) into dst.
  auto load_tile = [&](uint16_t* dst, const uint16_t* src, int64_t k0) {
#pragma unroll 4
    for (int e = tid; e < KT * HD / 8; e += kThreads) {
      const int kk = e / (HD / 8), d = (e % (HD / 8)) * 8;
      const bool ok = k0 + kk < ke;
      cp_async16(smem_u32(dst + kk * LD + d), src + (ok ? k0 + kk : k0) * HD + d, ok);
    }
  };
  if (kb < ke) load_tile(Ks, kh, kb);
  cp_async_commit();
  for (int e = tid; e < BQ * HD / 8; e += kThreads) {
    const int i = e / (HD / 8), d = (e % (HD / 8)) * 8, r = r0 + i;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < R) {
      const float4* src = reinterpret_cast<const float4*>(q + (int64_t(r / G) * Hq + h * G + r % G) * HD + d);
      const float4 x = __ldg(src), y = __ldg(src + 1);
      v = make_uint4(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w), pack_bf16(y.x, y.y), pack_bf16(y.z, y.w));
    }
    *reinterpret_cast<uint4*>(Qs + i * LD + d) = v;
  }

  const int rw = r0 + warp * 16 + g;                          // this thread's rows: rw and rw + 8
  const int64_t lim[2] = {p0 + rw / G, p0 + (rw + 8) / G};   // last key each row may see
  float o[HD / 8][4];
#pragma unroll
  for (int dn = 0; dn < HD / 8; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const uint16_t* qrow = Qs + (warp * 16 + (lane & 15)) * LD + (lane >> 4) * 8;
  const uint16_t* krow = Ks + ((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * 8;
  const uint16_t* vrow = Vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;

  for (int64_t k0 = kb; k0 < ke; k0 += KT) {
    cp_async_wait<0>();
    __syncthreads();  // K(k0) (and Q) visible; every warp is done reading the previous V tile
    load_tile(Vs, vh, k0);
    cp_async_commit();

    float s[KT / 8][4];
#pragma unroll
    for (int j = 0; j < KT / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a, smem_u32(qrow + kk * 16));
#pragma unroll
      for (int jp = 0; jp < KT / 16; ++jp) {
        uint32_t b[4];  // keys jp·16 + (0..7 | 8..15), dims kk·16 + (0..7, 8..15)
        ldsm_x4(b, smem_u32(krow + jp * 16 * LD + kk * 16));
        mma_bf16(s[2 * jp], a, b[0], b[1]);
        mma_bf16(s[2 * jp + 1], a, b[2], b[3]);
      }
    }
    if (k0 + KT > min(ke, kfull)) {
#pragma unroll
      for (int j = 0; j < KT / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t key = k0 + j * 8 + 2 * c + (e & 1);
          if (key >= ke || key > lim[e >> 1]) s[j][e] = -INFINITY;
        }
    }
    // online softmax; a row's 64 scores are spread over the 4 lanes of its quad
    float mb[2], alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mt = m[i];
#pragma unroll
      for (int j = 0; j < KT / 8; ++j) mt = fmaxf(mt, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
      mb[i] = mt == -INFINITY ? 0.f : mt;  // a row with no visible key yet keeps p = 0, alpha = 0
      alpha[i] = __expf(m[i] - mb[i]);
      m[i] = mt;
    }
    float ls[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < KT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = __expf(s[j][e] - mb[e >> 1]);
        ls[e >> 1] += s[j][e];
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + ls[i];  // per-lane partial sums, reduced at the end
#pragma unroll
    for (int dn = 0; dn < HD / 8; ++dn) {
      o[dn][0] *= alpha[0]; o[dn][1] *= alpha[0];
      o[dn][2] *= alpha[1]; o[dn][3] *= alpha[1];
    }

    cp_async_wait<0>();
    __syncthreads();  // V(k0) visible; every warp is done reading K(k0)
    if (k0 + KT < ke) load_tile(Ks, kh, k0 + KT);
    cp_async_commit();
#pragma unroll
    for (int kc2 = 0; kc2 < KT / 16; ++kc2) {
      const uint32_t a[4] = {pack_bf16(s[2 * kc2][0], s[2 * kc2][1]), pack_bf16(s[2 * kc2][2], s[2 * kc2][3]),
                             pack_bf16(s[2 * kc2 + 1][0], s[2 * kc2 + 1][1]),
                             pack_bf16(s[2 * kc2 + 1][2], s[2 * kc2 + 1][3])};
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t b[4];  // keys kc2·16 + (0..7, 8..15), dims dp·16 + (0..7 | 8..15), transposed
        ldsm_x4_t(b, smem_u32(vrow + kc2 * 16 * LD + dp * 16));
        mma_bf16(o[2 * dp], a, b[0], b[1]);
        mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rw + 8 * i;
    if (r >= R) continue;
    const int t = r / G, hq = h * G + r % G;
    if (nsplit == 1) {
      const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
      const float* gate = proj + int64_t(t) * ldp + int64_t(hq) * 2 * HD + HD;
      float* dst = out + int64_t(t) * Hq * HD + int64_t(hq) * HD;
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn) {
        const int d = dn * 8 + 2 * c;
        dst[d] = o[dn][2 * i] * inv * sigmoid(gate[d]);
        dst[d + 1] = o[dn][2 * i + 1] * inv * sigmoid(gate[d + 1]);
      }
    } else {
      const int64_t pi = (int64_t(split) * Hkv + h) * R + r;
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn)
        *reinterpret_cast<float2*>(po + pi * HD + dn * 8 + 2 * c) = make_float2(o[dn][2 * i], o[dn][2 * i + 1]);
      if (c == 0) { pm[pi] = m[i]; pl[pi] = l[i]; }
    }
  }
}

template <int HD>
void launch(dim3 grid, cudaStream_t s, const float* q, const float* proj, int64_t ldp, int T, int Hq, int Hkv,
            const int64_t* pos, const uint16_t* kc, const uint16_t* vc, int64_t cap, int nsplit, float* out, float* po,
            float* pm, float* pl) {
  attn_prefill_kernel<HD><<<grid, kThreads, prefill_smem<HD>(), s>>>(q, proj, ldp, T, Hq, Hkv, pos, kc, vc, cap, nsplit,
                                                                     out, po, pm, pl);
}

}  // namespace

void set_attn_prefill_simt(bool on) { g_simt.store(on, std::memory_order_relaxed); }
bool attn_prefill_simt() { return g_simt.load(std::memory_order_relaxed); }

void init_attn_prefill_kernels() {
  LILY_CU(cudaFuncSetAttribute(attn_prefill_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prefill_smem<64>())));
  LILY_CU(cudaFuncSetAttribute(attn_prefill_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prefill_smem<128>())));
  LILY_CU(cudaFuncSetAttribute(attn_prefill_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prefill_smem<256>())));
}

void attn_prefill(const float* q, const float* proj, int64_t ldp, int T, int Hq, int Hkv, int hd, const int64_t* pos,
                  const uint16_t* kc, const uint16_t* vc, int64_t cap, int nsplit, float* out, float* po, float* pm,
                  float* pl, cudaStream_t s) {
  const dim3 grid(cdiv(int64_t(Hq / Hkv) * T, kPrefillRows), Hkv, nsplit);
  switch (hd) {
    case 64: launch<64>(grid, s, q, proj, ldp, T, Hq, Hkv, pos, kc, vc, cap, nsplit, out, po, pm, pl); break;
    case 128: launch<128>(grid, s, q, proj, ldp, T, Hq, Hkv, pos, kc, vc, cap, nsplit, out, po, pm, pl); break;
    case 256: launch<256>(grid, s, q, proj, ldp, T, Hq, Hkv, pos, kc, vc, cap, nsplit, out, po, pm, pl); break;
    default: fail_internal("attn_prefill: head_dim must be 64, 128 or 256");
  }
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
