// Gated full attention core (model doc §3.3): q/k RMSNorm + partial NeoX RoPE + KV append, then causal
// GQA attention over packed query rows (token, query head of one KV head's group), so each K/V row loaded
// serves the whole group, split over the key range (flash-decoding). Decode (≤ 8 packed rows) runs the
// tensor-core kernel of attn_decode.cu; prompts the tensor-core kernel of attn_prefill.cu; the fp32 SIMT
// kernel (16-row tiles, 32-key tiles) is the fallback for shapes and devices those do not take. A second
// kernel merges the splits and applies the sigmoid output gate. Softmax in fp32, online over key tiles.
#include <algorithm>
#include <cmath>

#include "backend/cuda/attn.h"
#include "backend/cuda/attn_decode.h"
#include "backend/cuda/attn_prefill.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/ptx.cuh"

namespace lily::cuda {
namespace {

constexpr int BR = 16, BKEYS = 32, kAttnThreads = 128;

// Split partials of T rows (packed rows over all KV heads): po [nsplit][Hkv][R][hd], pm / pl [nsplit][Hkv][R].
struct Partials {
  float *po, *pm, *pl;
  size_t bytes;
};

Partials partials_layout(const AttnDev& a, int T, int nsplit, void* base) {
  Partials s{};
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) { char* r = p ? p + off : nullptr; off += (bytes + 255) & ~size_t(255); return r; };
  const size_t rows = size_t(T) * a.Hq;
  const size_t np = nsplit > 1 ? size_t(nsplit) * rows : 0;
  s.po = reinterpret_cast<float*>(take(sizeof(float) * np * a.hd));
  s.pm = reinterpret_cast<float*>(take(sizeof(float) * np));
  s.pl = reinterpret_cast<float*>(take(sizeof(float) * np));
  s.bytes = off;
  return s;
}

size_t q_bytes(const AttnDev& a, int T) { return (sizeof(float) * size_t(T) * a.Hq * a.hd + 255) & ~size_t(255); }

// Row t's position and caches (step_desc.h: the single-sequence or the step form).
__device__ __forceinline__ void row_kv(const StepSeqs& sq, int t, int64_t& p, uint16_t*& kc, uint16_t*& vc, int64_t& cap) {
  if (!sq.row_group) {
    p = *sq.pos + t;
    kc = sq.k;
    vc = sq.v;
    cap = sq.cap;
    return;
  }
  const DevGroup& g = sq.groups[sq.row_group[t]];
  const DevSlotLayer& e = sq.slots[g.slot];
  p = g.pos + (t - g.first);
  kc = e.k;
  vc = e.v;
  cap = e.cap;
}

// grid (T, Hq + 2 Hkv): q heads -> normed, roped, scaled q; k heads -> normed, roped, bf16 cache; v -> cache.
__global__ void qk_prep_kernel(const float* __restrict__ proj, int64_t ldp, int Hq, int Hkv, int hd, int rot, float theta,
                               float eps, const float* __restrict__ qw, const float* __restrict__ kw,
                               const float* __restrict__ inv_freq_tab, const StepSeqs seqs, float* __restrict__ qout) {
  extern __shared__ float v[];
  __shared__ float red[32];
  const int t = blockIdx.x, h = blockIdx.y;
  int64_t p = 0, cap = 0;
  uint16_t *kc = nullptr, *vc = nullptr;
  if (seqs.row_group) row_kv(seqs, t, p, kc, vc, cap);  // step form: no kernel of the step writes the tables
  // no early trigger: the decode attention launched early would be placed on SMs in the order the input
  // projection's blocks leave them, unevenly, and it is the longest kernel of the layer at long context
  grid_dependency_wait();
  if (!seqs.row_group) row_kv(seqs, t, p, kc, vc, cap);  // *pos may come from the previous kernel
  const float* pr = proj + int64_t(t) * ldp;
  if (h >= Hq + Hkv) {  // value head: copy into the cache
    const int kh = h - Hq - Hkv;
    const float* src = pr + int64_t(Hq) * 2 * hd + int64_t(Hkv) * hd + int64_t(kh) * hd;
    uint16_t* dst = vc + (int64_t(kh) * cap + p) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = __bfloat16_as_ushort(__float2bfloat16_rn(src[d]));
    return;
  }
  const bool isq = h < Hq;
  const float* src = isq ? pr + int64_t(h) * 2 * hd : pr + int64_t(Hq) * 2 * hd + int64_t(h - Hq) * hd;
  const float* w = isq ? qw : kw;
  float ss = 0.f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) { v[d] = src[d]; ss += src[d] * src[d]; }
  ss = block_sum(ss, red);  // also orders the v[] stores
  const float inv = rsqrtf(ss / float(hd) + eps);
  const int half = rot / 2;
  const float scale = isq ? rsqrtf(float(hd)) : 1.f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float y = v[d] * inv * w[d];
    if (d < rot) {
      const int i = d < half ? d : d - half;
      const float inv_freq = inv_freq_tab ? inv_freq_tab[i] : 1.f / powf(theta, float(2 * i) / float(rot));
      float sn, cs;
      sincosf(float(p) * inv_freq, &sn, &cs);
      const int pd = d < half ? d + half : d - half;
      const float other = v[pd] * inv * w[pd];
      y = d < half ? y * cs - other * sn : y * cs + other * sn;
    }
    if (isq)
      qout[(int64_t(t) * Hq + h) * hd + d] = y * scale;
    else
      kc[(int64_t(h - Hq) * cap + p) * hd + d] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
  }
}

template <int HD>
__global__ void __launch_bounds__(kAttnThreads) attn_kernel(const float* __restrict__ q, const float* __restrict__ proj,
    int64_t ldp, int T, int Hq, int Hkv, const int64_t* __restrict__ pos, const uint16_t* __restrict__ kc,
    const uint16_t* __restrict__ vc, int64_t cap, int nsplit, float* __restrict__ out, float* __restrict__ po,
    float* __restrict__ pm, float* __restrict__ pl) {
  extern __shared__ float sm[];
  float* Qs = sm;                       // [BR][HD+1]
  float* Ks = Qs + BR * (HD + 1);       // [BK][HD+1]
  float* Vs = Ks + BKEYS * (HD + 1);    // [BK][HD]
  float* Ps = Vs + BKEYS * HD;          // [BR][BK]
  float* Ms = Ps + BR * BKEYS;          // [BR]
  float* Ls = Ms + BR;                  // [BR]
  float* As = Ls + BR;                  // [BR]
  const int h = blockIdx.x, split = blockIdx.z, tid = threadIdx.x;
  const int G = Hq / Hkv, R = G * T;
  const int r0 = blockIdx.y * BR;
  const int64_t p0 = *pos;
  const int64_t N = p0 + T;
  const int last_row = min(R, r0 + BR) - 1;
  const int64_t kmax = p0 + last_row / G + 1;  // keys [0, kmax) can be seen by this tile
  const int64_t chunk = (N + nsplit - 1) / nsplit;
  const int64_t kb = int64_t(split) * chunk;
  const int64_t ke = min(min(N, kb + chunk), kmax);
  for (int e = tid; e < BR * HD; e += kAttnThreads) {
    const int i = e / HD, d = e % HD, r = r0 + i;
    Qs[i * (HD + 1) + d] = r < R ? q[(int64_t(r / G) * Hq + h * G + r % G) * HD + d] : 0.f;
  }
  if (tid < BR) { Ms[tid] = -INFINITY; Ls[tid] = 0.f; }
  constexpr int NACC = BR * HD / kAttnThreads;
  float acc[NACC];
#pragma unroll
  for (int a = 0; a < NACC; ++a) acc[a] = 0.f;
  const uint16_t* kh = kc + int64_t(h) * cap * HD;
  const uint16_t* vh = vc + int64_t(h) * cap * HD;
  for (int64_t k0 = kb; k0 < ke; k0 += BKEYS) {
    __syncthreads();
    // 16-byte loads: 8 bf16 of one key row per thread and load (rows are HD·2 bytes, 16-byte aligned)
#pragma unroll 4
    for (int e = tid; e < BKEYS * HD / 8; e += kAttnThreads) {
      const int kk = e / (HD / 8), d = (e % (HD / 8)) * 8;
      const int64_t key = k0 + kk;
      float kf[8], vf[8];
      if (key < ke) {
        bf8(__ldg(reinterpret_cast<const uint4*>(kh + key * HD + d)), kf);
        bf8(__ldg(reinterpret_cast<const uint4*>(vh + key * HD + d)), vf);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) kf[j] = vf[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        Ks[kk * (HD + 1) + d + j] = kf[j];
        Vs[kk * HD + d + j] = vf[j];
      }
    }
    __syncthreads();
    for (int e = tid; e < BR * BKEYS; e += kAttnThreads) {
      const int i = e / BKEYS, kk = e % BKEYS, r = r0 + i;
      const int64_t key = k0 + kk;
      float sc = -INFINITY;
      if (r < R && key < ke && key <= p0 + r / G) {
        float dot = 0.f;
#pragma unroll 8
        for (int d = 0; d < HD; ++d) dot += Qs[i * (HD + 1) + d] * Ks[kk * (HD + 1) + d];
        sc = dot;
      }
      Ps[i * BKEYS + kk] = sc;
    }
    __syncthreads();
    for (int i = tid >> 5; i < BR; i += kAttnThreads / 32) {
      const int lane = tid & 31;
      const float sc = Ps[i * BKEYS + lane];
      const float mold = Ms[i];
      const float mnew = fmaxf(mold, warp_max(sc));
      const float pr = mnew == -INFINITY ? 0.f : expf(sc - mnew);
      const float alpha = mnew == -INFINITY ? 1.f : expf(mold - mnew);
      const float ps = warp_sum(pr);
      Ps[i * BKEYS + lane] = pr;
      __syncwarp();
      if (lane == 0) { Ms[i] = mnew; Ls[i] = Ls[i] * alpha + ps; As[i] = alpha; }
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < NACC; ++a) {
      const int e = tid + kAttnThreads * a, i = e / HD, d = e % HD;
      float s = acc[a] * As[i];
      for (int kk = 0; kk < BKEYS; ++kk) s += Ps[i * BKEYS + kk] * Vs[kk * HD + d];
      acc[a] = s;
    }
  }
  __syncthreads();
#pragma unroll
  for (int a = 0; a < NACC; ++a) {
    const int e = tid + kAttnThreads * a, i = e / HD, d = e % HD, r = r0 + i;
    if (r >= R) continue;
    const int t = r / G, hq = h * G + r % G;
    if (nsplit == 1) {
      const float l = Ls[i];
      const float gate = proj[int64_t(t) * ldp + int64_t(hq) * 2 * HD + HD + d];
      out[int64_t(t) * Hq * HD + int64_t(hq) * HD + d] = (l > 0.f ? acc[a] / l : 0.f) * sigmoid(gate);
    } else {
      const int64_t pi = (int64_t(split) * Hkv + h) * R + r;
      po[pi * HD + d] = acc[a];
      if (d == 0) { pm[pi] = Ms[i]; pl[pi] = Ls[i]; }
    }
  }
}

// grid (R, Hkv, hd / 32), block 256 threads: merge the splits of one packed row for 32 of its dims
// (x-block i: packed row i of the call's T rows, or with `rows` of step row rows[i / G], query r = i % G),
// apply the gate. Every global load (split maxima, sums, the partials of splits w, w + 8, ... for warp w,
// lane = dim, and the gate) is issued before the first reduction, so the kernel waits on one L2 round
// trip. The block reduces the maxima and weights; warp 0 adds the 8 warps' partial sums.
__global__ void attn_combine_kernel(const float* __restrict__ po, const float* __restrict__ pm, const float* __restrict__ pl,
                                    int nsplit, int T, int Hq, int Hkv, int hd, const float* __restrict__ proj, int64_t ldp,
                                    float* __restrict__ out, const int32_t* __restrict__ rows) {
  constexpr int kMaxSplits = 128, kPer = kMaxSplits / 8;  // 8 warps, kPer splits each
  __shared__ float f[kMaxSplits];
  __shared__ float red[32];
  __shared__ float part[8][33];
  allow_dependent_launch();
  const int h = blockIdx.y, lane = threadIdx.x & 31, d = blockIdx.z * 32 + lane, w = threadIdx.x >> 5;
  const int G = Hq / Hkv, R = G * T;
  const int tid = threadIdx.x;
  const int t = rows ? rows[blockIdx.x / G] : int(blockIdx.x) / G, r = t * G + int(blockIdx.x) % G;  // the descriptor
  grid_dependency_wait();
  const int hq = h * G + r % G;
  const bool mine = tid < nsplit;
  const float ms = mine ? pm[(int64_t(tid) * Hkv + h) * R + r] : -INFINITY;
  const float ls = mine ? pl[(int64_t(tid) * Hkv + h) * R + r] : 0.f;
  float ov[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int s = w + 8 * i;
    ov[i] = s < nsplit ? po[((int64_t(s) * Hkv + h) * R + r) * hd + d] : 0.f;
  }
  const float gate = w == 0 ? proj[int64_t(t) * ldp + int64_t(hq) * 2 * hd + hd + d] : 0.f;
  float m = warp_max(ms);  // block max (nsplit <= 128 < blockDim)
  if (lane == 0) red[w] = m;
  __syncthreads();
  m = -INFINITY;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, red[i]);
  const float fs = (mine && ms != -INFINITY) ? expf(ms - m) : 0.f;
  if (tid < kMaxSplits) f[tid] = fs;
  const float l = block_sum(fs * ls, red);  // also orders f[] (and the reads of red above)
  float o = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) o += ov[i] * f[w + 8 * i];
  part[w][lane] = o;
  __syncthreads();
  if (w != 0) return;
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) tot += part[i][lane];
  out[int64_t(t) * Hq * hd + int64_t(hq) * hd + d] = (l > 0.f ? tot / l : 0.f) * sigmoid(gate);
}

template <int HD>
size_t attn_smem() {
  return sizeof(float) * (size_t(BR) * (HD + 1) + size_t(BKEYS) * (HD + 1) + size_t(BKEYS) * HD + BR * BKEYS + 3 * BR);
}

template <int HD>
void launch_attn(dim3 grid, cudaStream_t s, const float* q, const float* proj, int64_t ldp, int T, int Hq, int Hkv,
                 const int64_t* pos, const uint16_t* kc, const uint16_t* vc, int64_t cap, int nsplit, float* out,
                 float* po, float* pm, float* pl) {
  const size_t smem = attn_smem<HD>();
  attn_kernel<HD><<<grid, kAttnThreads, smem, s>>>(q, proj, ldp, T, Hq, Hkv, pos, kc, vc, cap, nsplit, out, po, pm, pl);
}

int dec_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 0;
    }
    return v > 0 ? v : 132;
  }();
  return n;
}

}  // namespace

void init_attn_kernels() {
  LILY_CU(cudaFuncSetAttribute(attn_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(attn_smem<64>())));
  LILY_CU(cudaFuncSetAttribute(attn_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(attn_smem<128>())));
  LILY_CU(cudaFuncSetAttribute(attn_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(attn_smem<256>())));
  int dev = 0, smem_optin = 0;
  LILY_CU(cudaGetDevice(&dev));
  LILY_CU(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  init_attn_decode_kernels(smem_optin);
  init_attn_prefill_kernels();
}

namespace {
// Tokens per z-block when a few-row step of one sequence (G·T > kDecRows, T <= kAttnTokenBlocksMax) runs the
// decode kernel per token block (KernelSwitches::attn_token_blocks): kDecRows / G; 0 when it does not.
int token_block_rows(const AttnDev& a, int T) {
  const int G = a.Hq / a.Hkv;
  if (!kernel_switches().attn_token_blocks || int64_t(G) * T <= kDecRows || T > kAttnTokenBlocksMax || G > kDecRows ||
      !attn_decode_covers(a.hd))
    return 0;
  return kDecRows / G;
}
}  // namespace

// Decode (R = G·T <= 8, or token blocks): one wave of blocks over the KV heads of all `groups` batched
// sequences and token blocks (the decode kernel's shared memory allows one block per SM), each split at least
// one 16-key sub-tile; prompts: ~2 waves of row tiles.
int attn_splits(const AttnDev& a, int T, int64_t ctx_max, int groups) {
  const int zr = token_block_rows(a, T);
  if (int64_t(a.Hq / a.Hkv) * T <= kDecRows || zr > 0) {
    const int64_t blocks = int64_t(a.Hkv) * std::max(1, groups) * (zr > 0 ? cdiv(T, zr) : 1);
    const int64_t want = std::max<int64_t>(1, dec_sm_count() / blocks);
    const int64_t by_len = (ctx_max + T + kDecSub - 1) / kDecSub;
    return int(std::clamp<int64_t>(std::min(want, by_len), 1, 128));
  }
  const bool tc = attn_prefill_supported(a.hd);  // tensor-core tiles: 64 rows, >= 256 keys per split
  const int64_t base = int64_t(a.Hkv) * cdiv(int64_t(a.Hq / a.Hkv) * T, tc ? kPrefillRows : BR);
  const int64_t want = (264 + base - 1) / base;
  const int64_t by_len = std::max<int64_t>(1, (ctx_max + T + (tc ? 255 : 63)) / (tc ? 256 : 64));
  return int(std::clamp<int64_t>(std::min(want, by_len), 1, 64));
}

size_t attn_scratch_bytes(const AttnDev& a, int T, int nsplit) { return q_bytes(a, T) + attn_partials_bytes(a, T, nsplit); }
size_t attn_q_bytes(const AttnDev& a, int T) { return q_bytes(a, T); }
size_t attn_partials_bytes(const AttnDev& a, int T, int nsplit) { return partials_layout(a, T, nsplit, nullptr).bytes; }
bool attn_decode_covers(int hd) { return (hd == 64 || hd == 128 || hd == 256) && attn_decode_fits(hd); }

void attn_prep(const AttnDev& a, const float* proj, int T, const StepSeqs& seqs, float* q, cudaStream_t s) {
  if (T <= 0) return;
  if (!(a.Hq % a.Hkv == 0 && a.rot % 2 == 0 && a.rot <= a.hd)) fail_internal("attn_prep: bad dimensions");
  launch_pdl(qk_prep_kernel, dim3(T, a.Hq + 2 * a.Hkv), dim3(128), sizeof(float) * a.hd, s, proj, int64_t(a.proj_width()),
             a.Hq, a.Hkv, a.hd, a.rot, a.theta, a.eps, a.q_norm, a.k_norm, a.inv_freq, seqs, q);
  LILY_CU_LAUNCH();
}

namespace {
void combine(const AttnDev& a, const Partials& pt, int nsplit, int T, int n_packed, const float* proj, float* out,
             const int32_t* rows, cudaStream_t s) {
  launch_pdl(attn_combine_kernel, dim3(n_packed, a.Hkv, a.hd / 32), dim3(256), 0, s, pt.po, pt.pm, pt.pl, nsplit, T, a.Hq,
             a.Hkv, a.hd, proj, int64_t(a.proj_width()), out, rows);
  LILY_CU_LAUNCH();
}
}  // namespace

void attn_rows(const AttnDev& a, const float* q, const float* proj, int T, const int64_t* pos, const uint16_t* k_cache,
               const uint16_t* v_cache, int64_t cap, int nsplit, float* out, void* partials, cudaStream_t s) {
  if (T <= 0) return;
  if (!(a.Hq % a.Hkv == 0 && nsplit >= 1 && nsplit <= 128)) fail_internal("attn_rows: bad dimensions or split count (1..128)");
  const Partials pt = partials_layout(a, T, nsplit, partials);
  const int64_t ldp = a.proj_width();
  const int R = (a.Hq / a.Hkv) * T;
  const bool decode = R <= kDecRows;
  const int zr = token_block_rows(a, T);
  if ((decode && attn_decode_fits(a.hd)) || zr > 0) {
    StepSeqs one;
    one.pos = pos;
    one.k = const_cast<uint16_t*>(k_cache);
    one.v = const_cast<uint16_t*>(v_cache);
    one.cap = cap;
    attn_decode_launch(a, q, proj, T, one, nullptr, zr > 0 ? int(cdiv(T, zr)) : 1, nsplit, out, pt.po, pt.pm, pt.pl, s,
                       zr);
  } else if (!decode && attn_prefill_supported(a.hd) && !attn_prefill_simt()) {
    attn_prefill(q, proj, ldp, T, a.Hq, a.Hkv, a.hd, pos, k_cache, v_cache, cap, nsplit, out, pt.po, pt.pm, pt.pl, s);
    LILY_CU_LAUNCH();
  } else {  // prompts on request, and decode where the device's shared memory is too small for the ring
    const dim3 grid(a.Hkv, cdiv(R, BR), nsplit);
    switch (a.hd) {
      case 64: launch_attn<64>(grid, s, q, proj, ldp, T, a.Hq, a.Hkv, pos, k_cache, v_cache, cap, nsplit, out, pt.po, pt.pm, pt.pl); break;
      case 128: launch_attn<128>(grid, s, q, proj, ldp, T, a.Hq, a.Hkv, pos, k_cache, v_cache, cap, nsplit, out, pt.po, pt.pm, pt.pl); break;
      case 256: launch_attn<256>(grid, s, q, proj, ldp, T, a.Hq, a.Hkv, pos, k_cache, v_cache, cap, nsplit, out, pt.po, pt.pm, pt.pl); break;
      default: fail_internal("attn_rows: head_dim must be 64, 128 or 256 on CUDA");
    }
    LILY_CU_LAUNCH();
  }
  if (nsplit > 1) combine(a, pt, nsplit, T, R, proj, out, nullptr, s);
}

void attn_decode_groups(const AttnDev& a, const float* q, const float* proj, int T, const StepSeqs& seqs, const int32_t* list,
                        int groups, const int32_t* rows, int n_rows, int nsplit, float* out, void* partials, cudaStream_t s) {
  if (groups <= 0) return;
  if (!seqs.row_group || !list || !rows) fail_internal("attn_decode_groups: needs the step form and the group and row lists");
  if (!(a.Hq % a.Hkv == 0 && nsplit >= 1 && nsplit <= 128) || !attn_decode_fits(a.hd))
    fail_internal("attn_decode_groups: bad dimensions, split count (1..128) or no decode kernel on this device");
  const Partials pt = partials_layout(a, T, nsplit, partials);
  attn_decode_launch(a, q, proj, T, seqs, list, groups, nsplit, out, pt.po, pt.pm, pt.pl, s);
  if (nsplit > 1) combine(a, pt, nsplit, T, n_rows * (a.Hq / a.Hkv), proj, out, rows, s);
}

void attn_core(const AttnDev& a, const float* proj, int T, const int64_t* pos, uint16_t* k_cache, uint16_t* v_cache,
               int64_t cap, int nsplit, float* out, void* scratch, cudaStream_t s) {
  if (T <= 0) return;
  StepSeqs one;
  one.pos = pos;
  one.k = k_cache;
  one.v = v_cache;
  one.cap = cap;
  auto* q = static_cast<float*>(scratch);
  attn_prep(a, proj, T, one, q, s);
  attn_rows(a, q, proj, T, pos, k_cache, v_cache, cap, nsplit, out, static_cast<char*>(scratch) + q_bytes(a, T), s);
}

}  // namespace lily::cuda
