// Decode attention on the tensor cores (attn_decode.h): R = G·T <= kDecRows packed rows per KV head.
#include <algorithm>
#include <cmath>

#include "backend/cuda/attn_decode.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"

namespace lily::cuda {
namespace {

// Decode attention (R = G·T <= 8 packed rows) on the tensor cores, at fp32-grade precision.
// Block = one KV head × one key split, kDecWarps warps. The split's keys go in 16-key sub-tiles to the
// warps round-robin; each warp streams its own sub-tiles (K and V, bf16, separate cp.async groups)
// through its own NS-stage ring, so warps only meet at the final merge. Per sub-tile, mma.sync
// m16n8k16 (bf16 in, fp32 out):
//   S = Q Kᵀ  A rows 0-7: bf16(q) of packed rows 0-7; rows 8-15: bf16(q - bf16(q)). The pair holds q to
//             2^-16 relative; K is bf16 in the cache, so the products are exact and a thread adds its
//             row g and row g + 8 accumulators.
//   O += P V  p (fp32) split the same way into A rows 0-7 / 8-15; the two halves of the result are added
//             into fp32 registers as O = O·alpha + (hi + lo) (round-to-nearest accumulation over tiles).
// Online softmax in fp32 per warp (row max and sum over the 4 lanes of a quad). The warps merge through
// shared memory and write the split partials (or, with one split, the gated output).
constexpr int kDecWarps = 4;  // warps per block

template <int HD>
struct DecTile {
  static constexpr int LD = HD + 8;  // bf16 row pitch: +16 bytes puts the 8 rows of an ldmatrix phase in distinct bank groups
  // ring stages per warp: while a warp waits, NS sub-tiles (NS × 2 × 16 × HD × 2 bytes) are in flight;
  // 4 warps keep ~64-128 KB per SM in flight, above HBM bandwidth × latency per SM (~40 KB on H200)
  static constexpr int NS = HD == 256 ? 2 : HD == 128 ? 3 : 4;
  static constexpr int STAGE = 2 * kDecSub * LD;  // bf16 per stage: 16 K rows, then 16 V rows
  static constexpr int OP = HD + 8;               // fp32 pitch of the merge rows (2 wavefronts per float2 store)
  static constexpr size_t smem = sizeof(uint16_t) * (size_t(16) * LD + size_t(kDecWarps) * NS * STAGE);
  static_assert(sizeof(float) * (size_t(kDecWarps) * kDecRows * (OP + 2)) <= smem, "merge area exceeds the rings");
};

// x = hi + lo (to 2^-16 relative) as bf16 pairs: hi = bf16(x), lo = bf16(x - hi); x0 in the low halves.
__device__ __forceinline__ void split_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  hi = uint32_t(__bfloat16_as_ushort(h.x)) | uint32_t(__bfloat16_as_ushort(h.y)) << 16;
  const __nv_bfloat162 r = __floats2bfloat162_rn(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xffff0000u));
  lo = uint32_t(__bfloat16_as_ushort(r.x)) | uint32_t(__bfloat16_as_ushort(r.y)) << 16;
}

// Grid (Hkv, nsplit, groups): with `list`, z-block g serves group list[g] of the step (seqs in the step
// form), its rows at their global indices (q, proj, out, and the partials at global packed row
// t·G + r % G of R_all = G·T_all rows); without, the call's T_all rows are one sequence, z-block z its
// tokens [z·zrows, z·zrows + zrows) when zrows > 0 (a few-row step whose G·T_all packed rows exceed
// kDecRows), else all of them.
template <int HD>
__global__ void __launch_bounds__(32 * kDecWarps, 1) attn_decode_kernel(const float* __restrict__ q,
    const float* __restrict__ proj, int64_t ldp, int T_all, int Hq, int Hkv, const StepSeqs seqs,
    const int32_t* __restrict__ list, int nsplit, float* __restrict__ out, float* __restrict__ po, float* __restrict__ pm,
    float* __restrict__ pl, int zrows) {
  using C = DecTile<HD>;
  constexpr int LD = C::LD, NS = C::NS, NW = kDecWarps, SUB = kDecSub, CPR = HD / 8;  // CPR: 16-byte chunks per row
  extern __shared__ __align__(16) uint16_t dsm[];
  uint16_t* Qs = dsm;  // [16][LD]: rows 0-7 hi, rows 8-15 lo parts of the packed query rows (zero past R)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;  // mma fragment row (= packed row) and column pair
  uint16_t* ring = dsm + 16 * LD + warp * NS * C::STAGE;  // this warp's [NS][K 16 | V 16][LD]
  const int h = blockIdx.x, split = blockIdx.y;
  int T = T_all, t0 = 0;
  int64_t p0 = 0, cap;
  const uint16_t *kc, *vc;
  if (list) {  // the descriptor and slot table: no kernel of the step writes them, so read before the wait
    const DevGroup& gr = seqs.groups[list[blockIdx.z]];
    const DevSlotLayer& e = seqs.slots[gr.slot];
    T = gr.rows;
    t0 = gr.first;
    p0 = gr.pos;
    kc = e.k;
    vc = e.v;
    cap = e.cap;
  } else {
    kc = seqs.k;
    vc = seqs.v;
    cap = seqs.cap;
    if (zrows > 0) {
      t0 = int(blockIdx.z) * zrows;
      T = min(zrows, T_all - t0);
    }
  }
  // no early trigger: the combine has nothing to prefetch, and its blocks would hold SM slots during the
  // key sweep
  grid_dependency_wait();
  if (!list) p0 = *seqs.pos + t0;  // may come from the previous kernel
  const int G = Hq / Hkv, R = G * T, R_all = G * T_all;
  const int64_t N = p0 + T;
  const int64_t chunk = (N + nsplit - 1) / nsplit;
  const int64_t kb = min(N, int64_t(split) * chunk), ke = min(N, kb + chunk);
  const int nsub = int((ke - kb + SUB - 1) / SUB);
  const int cnt = nsub > warp ? (nsub - warp + NW - 1) / NW : 0;  // this warp's sub-tiles: warp, warp + NW, ...
  const uint16_t* kh = kc + int64_t(h) * cap * HD;
  const uint16_t* vh = vc + int64_t(h) * cap * HD;

  // Sub-tile j of this warp into stage j % NS as two commit groups (K, then V); empty groups past cnt
  // keep the group count per call fixed. Keys at or past ke are zero-filled (cache rows there may be stale).
  auto issue = [&](int j) {
    const int64_t k0 = kb + int64_t(warp + NW * j) * SUB;
    const uint32_t st = smem_u32(ring + (j % NS) * C::STAGE);
#pragma unroll
    for (int part = 0; part < 2; ++part) {
      if (j < cnt) {
        const uint16_t* src = part ? vh : kh;
#pragma unroll
        for (int i = 0; i < SUB * CPR / 32; ++i) {
          const int e = lane + 32 * i, kk = e / CPR, d = (e % CPR) * 8;
          const bool live = k0 + kk < ke;
          cp_async16(st + 2 * ((part * SUB + kk) * LD + d), src + (k0 + (live ? kk : 0)) * HD + d, live);
        }
      }
      cp_async_commit();
    }
  };
#pragma unroll
  for (int j = 0; j < NS - 1; ++j) issue(j);

  for (int e = tid; e < kDecRows * CPR; e += 32 * NW) {
    const int r = e / CPR, d = (e % CPR) * 8;
    uint4 hi = make_uint4(0, 0, 0, 0), lo = hi;
    if (r < R) {
      const float4* src = reinterpret_cast<const float4*>(q + (int64_t(t0 + r / G) * Hq + h * G + r % G) * HD + d);
      const float4 x = src[0], y = src[1];
      split_bf16x2(x.x, x.y, hi.x, lo.x);
      split_bf16x2(x.z, x.w, hi.y, lo.y);
      split_bf16x2(y.x, y.y, hi.z, lo.z);
      split_bf16x2(y.z, y.w, hi.w, lo.w);
    }
    *reinterpret_cast<uint4*>(Qs + r * LD + d) = hi;
    *reinterpret_cast<uint4*>(Qs + (kDecRows + r) * LD + d) = lo;
  }
  __syncthreads();

  // ldmatrix lane addresses: Q as the A operand; K rows (keys) as B; V rows through .trans as B
  const uint32_t qa = smem_u32(Qs + (lane & 15) * LD + (lane >> 4) * 8);
  const int koff = 2 * (((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * 8);
  const int voff = 2 * ((SUB + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8);
  const int64_t lim = p0 + g / G;  // last key packed row g may see
  float o[HD / 8][2];              // row g, dims 8·dn + 2c and + 1
#pragma unroll
  for (int dn = 0; dn < HD / 8; ++dn) o[dn][0] = o[dn][1] = 0.f;
  float m = -INFINITY, l = 0.f;  // l: this lane's share of the row sum

  for (int j = 0; j < cnt; ++j) {
    __syncwarp();  // every lane is done reading stage (j - 1) % NS, which this issue refills
    issue(j + NS - 1);
    cp_async_wait<2 * NS - 1>();  // K of sub-tile j (this lane's copies) ...
    __syncwarp();                 // ... and every lane's
    const uint32_t st = smem_u32(ring + (j % NS) * C::STAGE);
    float s[2][2][4] = {};  // [chain over alternate 16-dim steps][8-key n-tile][fragment]
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[4], b[4];
      ldsm_x4(a, qa + 32 * kk);
      ldsm_x4(b, st + koff + 32 * kk);
      mma_bf16(s[kk & 1][0], a, b[0], b[1]);
      mma_bf16(s[kk & 1][1], a, b[2], b[3]);
    }
    const int64_t k0 = kb + int64_t(warp + NW * j) * SUB;
    float x[4];  // row g, keys k0 + 2c, + 1, k0 + 8 + 2c, + 1
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = i >> 1, e = i & 1;
      const int64_t key = k0 + 8 * n + 2 * c + e;
      const float v = (s[0][n][e] + s[0][n][e + 2]) + (s[1][n][e] + s[1][n][e + 2]);
      x[i] = key < ke && key <= lim ? v : -INFINITY;
    }
    float mt = fmaxf(fmaxf(m, fmaxf(x[0], x[1])), fmaxf(x[2], x[3]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float mb = mt == -INFINITY ? 0.f : mt;  // a row with no visible key yet keeps p = 0, alpha = 0
    const float alpha = __expf(m - mb);
    m = mt;
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = __expf(x[i] - mb);
    l = l * alpha + ((p[0] + p[1]) + (p[2] + p[3]));
    uint32_t a[4];  // A rows g: hi, g + 8: lo; keys 2c, 2c + 1 then 8 + 2c, 9 + 2c
    split_bf16x2(p[0], p[1], a[0], a[1]);
    split_bf16x2(p[2], p[3], a[2], a[3]);
    cp_async_wait<2 * NS - 2>();  // V of sub-tile j
    __syncwarp();
#pragma unroll
    for (int dp = 0; dp < HD / 16; ++dp) {
      uint32_t b[4];  // keys 0-7 | 8-15 × dims 16·dp + (0-7, 8-15), transposed
      ldsm_x4_t(b, st + voff + 32 * dp);
      float t0[4] = {0.f, 0.f, 0.f, 0.f}, t1[4] = {0.f, 0.f, 0.f, 0.f};
      mma_bf16(t0, a, b[0], b[1]);
      mma_bf16(t1, a, b[2], b[3]);
      o[2 * dp][0] = fmaf(o[2 * dp][0], alpha, t0[0] + t0[2]);
      o[2 * dp][1] = fmaf(o[2 * dp][1], alpha, t0[1] + t0[3]);
      o[2 * dp + 1][0] = fmaf(o[2 * dp + 1][0], alpha, t1[0] + t1[2]);
      o[2 * dp + 1][1] = fmaf(o[2 * dp + 1][1], alpha, t1[1] + t1[3]);
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; the merge below reuses the rings
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // merge the warps: Os [NW][8][OP] (this warp's O scaled to the block max), Ms / Ls [NW][8]
  constexpr int OP = C::OP;
  float* Os = reinterpret_cast<float*>(dsm);
  float* Ms = Os + NW * kDecRows * OP;
  float* Ls = Ms + NW * kDecRows;
  __syncthreads();  // every warp is done with Qs and its ring
  if (c == 0) { Ms[warp * kDecRows + g] = m; Ls[warp * kDecRows + g] = l; }
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < NW; ++w) M = fmaxf(M, Ms[w * kDecRows + g]);
  const float f = m == -INFINITY ? 0.f : __expf(m - M);
#pragma unroll
  for (int dn = 0; dn < HD / 8; ++dn)
    *reinterpret_cast<float2*>(Os + (warp * kDecRows + g) * OP + 8 * dn + 2 * c) = make_float2(o[dn][0] * f, o[dn][1] * f);
  __syncthreads();
  for (int e = tid; e < R * HD; e += 32 * NW) {
    const int r = e / HD, d = e % HD;
    float Mr = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w) Mr = fmaxf(Mr, Ms[w * kDecRows + r]);
    float L = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float mw = Ms[w * kDecRows + r];
      L += (mw == -INFINITY ? 0.f : __expf(mw - Mr)) * Ls[w * kDecRows + r];
      acc += Os[(w * kDecRows + r) * OP + d];
    }
    const int t = t0 + r / G, hq = h * G + r % G;
    if (nsplit == 1) {
      const float gate = proj[int64_t(t) * ldp + int64_t(hq) * 2 * HD + HD + d];
      out[int64_t(t) * Hq * HD + int64_t(hq) * HD + d] = (L > 0.f ? acc / L : 0.f) * sigmoid(gate);
    } else {
      const int64_t pi = (int64_t(split) * Hkv + h) * R_all + int64_t(t0) * G + r;
      po[pi * HD + d] = acc;
      if (d == 0) { pm[pi] = Mr; pl[pi] = L; }
    }
  }
}

int g_smem_optin = 1 << 30;  // opt-in shared memory per block of the device, set by init_attn_decode_kernels

}  // namespace

bool attn_decode_fits(int hd) {
  const size_t need = hd == 64 ? DecTile<64>::smem : hd == 128 ? DecTile<128>::smem : DecTile<256>::smem;
  return need <= size_t(g_smem_optin);
}

namespace {

template <int HD>
void init_decode() {
  if (attn_decode_fits(HD))
    LILY_CU(cudaFuncSetAttribute(attn_decode_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(DecTile<HD>::smem)));
}

template <int HD>
void launch_decode(const AttnDev& a, const float* q, const float* proj, int T, const StepSeqs& seqs, const int32_t* list,
                   int groups, int nsplit, float* out, float* po, float* pm, float* pl, cudaStream_t s, int zrows) {
  launch_pdl(attn_decode_kernel<HD>, dim3(a.Hkv, nsplit, groups), dim3(32 * kDecWarps), DecTile<HD>::smem, s, q, proj,
             int64_t(a.proj_width()), T, a.Hq, a.Hkv, seqs, list, nsplit, out, po, pm, pl, zrows);
}

}  // namespace

void init_attn_decode_kernels(int smem_optin) {
  g_smem_optin = smem_optin;
  init_decode<64>();
  init_decode<128>();
  init_decode<256>();
}

void attn_decode_launch(const AttnDev& a, const float* q, const float* proj, int T, const StepSeqs& seqs, const int32_t* list,
                        int groups, int nsplit, float* out, float* po, float* pm, float* pl, cudaStream_t s, int zrows) {
  if (zrows > 0 && (list || int64_t(a.Hq / a.Hkv) * zrows > kDecRows || groups != (T + zrows - 1) / zrows))
    fail_internal("attn_decode_launch: token blocks need one sequence, G·zrows <= 8 and cdiv(T, zrows) groups");
  switch (a.hd) {
    case 64: launch_decode<64>(a, q, proj, T, seqs, list, groups, nsplit, out, po, pm, pl, s, zrows); break;
    case 128: launch_decode<128>(a, q, proj, T, seqs, list, groups, nsplit, out, po, pm, pl, s, zrows); break;
    case 256: launch_decode<256>(a, q, proj, T, seqs, list, groups, nsplit, out, po, pm, pl, s, zrows); break;
    default: fail_internal("attn: head_dim must be 64, 128 or 256 on CUDA");
  }
  LILY_CU_LAUNCH();
}

}  // namespace lily::cuda
