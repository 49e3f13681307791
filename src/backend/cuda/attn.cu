// Gated full attention core (model doc §3.3): q/k RMSNorm + partial NeoX RoPE + KV append, then causal
// GQA attention. One kernel serves prompts and decode: a block owns one KV head, a tile of 16 packed
// query rows (token, query head of that KV head's group), so each K/V row loaded serves the whole
// group, and one split of the key range (flash-decoding); splits are merged by a second kernel that
// also applies the sigmoid output gate. Softmax in fp32, online over key tiles of 32.
#include <algorithm>
#include <cmath>

#include "backend/cuda/attn_prefill.h"
#include "backend/cuda/kernels.cuh"

namespace lily::cuda {
namespace {

constexpr int BR = 16, BKEYS = 32, kAttnThreads = 128;

struct AttnScratch {
  float *q, *po, *pm, *pl;
  size_t bytes;
};

AttnScratch layout(const AttnDev& a, int T, int nsplit, void* base) {
  AttnScratch s{};
  char* p = static_cast<char*>(base);
  size_t off = 0;
  auto take = [&](size_t bytes) { char* r = p ? p + off : nullptr; off += (bytes + 255) & ~size_t(255); return r; };
  const size_t rows = size_t(T) * a.Hq;  // packed rows over all KV heads
  s.q = reinterpret_cast<float*>(take(sizeof(float) * rows * a.hd));
  const size_t np = nsplit > 1 ? size_t(nsplit) * rows : 0;
  s.po = reinterpret_cast<float*>(take(sizeof(float) * np * a.hd));
  s.pm = reinterpret_cast<float*>(take(sizeof(float) * np));
  s.pl = reinterpret_cast<float*>(take(sizeof(float) * np));
  s.bytes = off;
  return s;
}

// grid (T, Hq + 2 Hkv): q heads -> normed, roped, scaled q; k heads -> normed, roped, bf16 cache; v -> cache.
__global__ void qk_prep_kernel(const float* __restrict__ proj, int64_t ldp, int Hq, int Hkv, int hd, int rot, float theta,
                               float eps, const float* __restrict__ qw, const float* __restrict__ kw,
                               const float* __restrict__ inv_freq_tab, const int64_t* __restrict__ pos, uint16_t* __restrict__ kc, uint16_t* __restrict__ vc,
                               int64_t cap, float* __restrict__ qout) {
  extern __shared__ float v[];
  __shared__ float red[32];
  // no early trigger: the decode attention launched early would be placed on SMs in the order the input
  // projection's blocks leave them, unevenly, and it is the longest kernel of the layer at long context
  grid_dependency_wait();
  const int t = blockIdx.x, h = blockIdx.y;
  const int64_t p = *pos + t;
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

// Decode attention (R = G·T <= 8 packed rows): block = one KV head × one key split, one warp per packed
// row. A tile of 32 keys (K and V, bf16) is staged in shared memory; each lane holds DPL = HD/32 dims of
// its row's query and output, a key's score is a warp sum, and the online softmax runs per warp. Writes
// the split partials (or, with one split, the gated output).
constexpr int kDecKeys = 32, kDecRows = 8;
template <int HD>
__global__ void __launch_bounds__(256) attn_decode_kernel(const float* __restrict__ q, const float* __restrict__ proj,
    int64_t ldp, int T, int Hq, int Hkv, const int64_t* __restrict__ pos, const uint16_t* __restrict__ kc,
    const uint16_t* __restrict__ vc, int64_t cap, int nsplit, float* __restrict__ out, float* __restrict__ po,
    float* __restrict__ pm, float* __restrict__ pl) {
  constexpr int DPL = HD / 32;  // dims per lane: 2, 4 or 8
  __shared__ __align__(16) uint16_t Ks[kDecKeys * HD];
  __shared__ __align__(16) uint16_t Vs[kDecKeys * HD];
  // no early trigger: the combine has nothing to prefetch, and its blocks would hold SM slots during the
  // key sweep
  grid_dependency_wait();
  const int h = blockIdx.x, split = blockIdx.y;
  const int G = Hq / Hkv, R = G * T;
  const int r = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = r / G, hq = h * G + r % G;
  const int64_t p0 = *pos, N = p0 + T;
  const int64_t chunk = (N + nsplit - 1) / nsplit;
  const int64_t kb = int64_t(split) * chunk, ke = min(N, kb + chunk);
  const int64_t klast = p0 + t;  // causal: keys <= klast
  float qv[DPL], acc[DPL];
#pragma unroll
  for (int d = 0; d < DPL; ++d) {
    qv[d] = q[(int64_t(t) * Hq + hq) * HD + lane * DPL + d];
    acc[d] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const uint16_t* kh = kc + int64_t(h) * cap * HD;
  const uint16_t* vh = vc + int64_t(h) * cap * HD;
  for (int64_t k0 = kb; k0 < ke; k0 += kDecKeys) {
    const int nk = int(ke - k0 < int64_t(kDecKeys) ? ke - k0 : int64_t(kDecKeys));
    __syncthreads();
    for (int e = threadIdx.x; e < nk * HD / 8; e += blockDim.x) {
      reinterpret_cast<uint4*>(Ks)[e] = __ldg(reinterpret_cast<const uint4*>(kh + k0 * HD) + e);
      reinterpret_cast<uint4*>(Vs)[e] = __ldg(reinterpret_cast<const uint4*>(vh + k0 * HD) + e);
    }
    __syncthreads();
    float my = -INFINITY;  // lane kk keeps the score of key k0 + kk
    for (int kk = 0; kk < nk; ++kk) {
      const uint16_t* kr = Ks + kk * HD + lane * DPL;
      float dot = 0.f;
#pragma unroll
      for (int d = 0; d < DPL; d += 2) {
        const uint32_t w2 = *reinterpret_cast<const uint32_t*>(kr + d);
        dot += __uint_as_float(w2 << 16) * qv[d] + __uint_as_float(w2 & 0xffff0000u) * qv[d + 1];
      }
      dot = warp_sum(dot);
      if (lane == kk) my = k0 + kk <= klast ? dot : -INFINITY;
    }
    const float mnew = fmaxf(m, warp_max(my));
    if (mnew == -INFINITY) continue;  // every key of this tile is in this row's future
    const float p = __expf(my - mnew), alpha = __expf(m - mnew);
    l = l * alpha + warp_sum(p);
    m = mnew;
#pragma unroll
    for (int d = 0; d < DPL; ++d) acc[d] *= alpha;
    for (int kk = 0; kk < nk; ++kk) {
      const float pk = __shfl_sync(0xffffffffu, p, kk);
      const uint16_t* vr = Vs + kk * HD + lane * DPL;
#pragma unroll
      for (int d = 0; d < DPL; d += 2) {
        const uint32_t w2 = *reinterpret_cast<const uint32_t*>(vr + d);
        acc[d] += pk * __uint_as_float(w2 << 16);
        acc[d + 1] += pk * __uint_as_float(w2 & 0xffff0000u);
      }
    }
  }
  if (r >= R) return;
  if (nsplit == 1) {
#pragma unroll
    for (int d = 0; d < DPL; ++d) {
      const int dd = lane * DPL + d;
      const float gate = proj[int64_t(t) * ldp + int64_t(hq) * 2 * HD + HD + dd];
      out[int64_t(t) * Hq * HD + int64_t(hq) * HD + dd] = (l > 0.f ? acc[d] / l : 0.f) * sigmoid(gate);
    }
  } else {
    const int64_t pi = (int64_t(split) * Hkv + h) * R + r;
#pragma unroll
    for (int d = 0; d < DPL; ++d) po[pi * HD + lane * DPL + d] = acc[d];
    if (lane == 0) { pm[pi] = m; pl[pi] = l; }
  }
}

// grid (R, Hkv, hd / 32), block 256 threads: merge the splits of one packed row for 32 of its dims,
// apply the gate. The split maxima and weights are reduced by the whole block; warp w then sums splits
// w, w + 8, ... for the 32 dims (lane = dim), and warp 0 adds the 8 partial sums.
__global__ void attn_combine_kernel(const float* __restrict__ po, const float* __restrict__ pm, const float* __restrict__ pl,
                                    int nsplit, int T, int Hq, int Hkv, int hd, const float* __restrict__ proj, int64_t ldp,
                                    float* __restrict__ out) {
  __shared__ float f[128];
  __shared__ float red[32];
  __shared__ float part[8][33];
  pdl_entry();
  const int r = blockIdx.x, h = blockIdx.y, d = blockIdx.z * 32 + (threadIdx.x & 31), w = threadIdx.x >> 5;
  const int G = Hq / Hkv, R = G * T;
  const int tid = threadIdx.x;
  const float ms = tid < nsplit ? pm[(int64_t(tid) * Hkv + h) * R + r] : -INFINITY;
  float m = ms;  // block max (nsplit <= 128 < blockDim)
  m = warp_max(m);
  if ((tid & 31) == 0) red[tid >> 5] = m;
  __syncthreads();
  m = -INFINITY;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) m = fmaxf(m, red[i]);
  const float fs = (tid < nsplit && ms != -INFINITY) ? expf(ms - m) : 0.f;
  if (tid < nsplit) f[tid] = fs;
  const float l = block_sum(tid < nsplit ? fs * pl[(int64_t(tid) * Hkv + h) * R + r] : 0.f, red);  // also orders f[]
  float o = 0.f;
#pragma unroll 4
  for (int s = w; s < nsplit; s += 8) o += po[((int64_t(s) * Hkv + h) * R + r) * hd + d] * f[s];
  part[w][threadIdx.x & 31] = o;
  __syncthreads();
  if (w != 0) return;
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) tot += part[i][threadIdx.x & 31];
  const int t = r / G, hq = h * G + r % G;
  const float gate = proj[int64_t(t) * ldp + int64_t(hq) * 2 * hd + hd + d];
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

}  // namespace

void init_attn_kernels() {
  LILY_CU(cudaFuncSetAttribute(attn_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(attn_smem<64>())));
  LILY_CU(cudaFuncSetAttribute(attn_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(attn_smem<128>())));
  LILY_CU(cudaFuncSetAttribute(attn_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(attn_smem<256>())));
  init_attn_prefill_kernels();
}

// Decode (R = G·T <= 8): 32-key splits up to 128 per KV head; prompts: ~2 waves of row tiles.
int attn_splits(const AttnDev& a, int T, int64_t ctx_max) {
  if (int64_t(a.Hq / a.Hkv) * T <= kDecRows) {
    const int64_t want = (2 * 132 + a.Hkv - 1) / a.Hkv;
    const int64_t by_len = std::max<int64_t>(1, (ctx_max + T + kDecKeys - 1) / kDecKeys);
    return int(std::clamp<int64_t>(std::min(want, by_len), 1, 128));
  }
  const bool tc = attn_prefill_supported(a.hd);  // tensor-core tiles: 64 rows, >= 256 keys per split
  const int64_t base = int64_t(a.Hkv) * cdiv(int64_t(a.Hq / a.Hkv) * T, tc ? kPrefillRows : BR);
  const int64_t want = (264 + base - 1) / base;
  const int64_t by_len = std::max<int64_t>(1, (ctx_max + T + (tc ? 255 : 63)) / (tc ? 256 : 64));
  return int(std::clamp<int64_t>(std::min(want, by_len), 1, 64));
}

size_t attn_scratch_bytes(const AttnDev& a, int T, int nsplit) { return layout(a, T, nsplit, nullptr).bytes; }

void attn_core(const AttnDev& a, const float* proj, int T, const int64_t* pos, uint16_t* k_cache, uint16_t* v_cache,
               int64_t cap, int nsplit, float* out, void* scratch, cudaStream_t s) {
  if (T <= 0) return;
  if (!(a.Hq % a.Hkv == 0 && a.rot % 2 == 0 && a.rot <= a.hd && nsplit >= 1 && nsplit <= 128))
    fail_internal("attn_core: bad dimensions or split count (1..128)");
  AttnScratch sc = layout(a, T, nsplit, scratch);
  const int64_t ldp = a.proj_width();
  launch_pdl(qk_prep_kernel, dim3(T, a.Hq + 2 * a.Hkv), dim3(128), sizeof(float) * a.hd, s, proj, ldp, a.Hq, a.Hkv, a.hd,
             a.rot, a.theta, a.eps, a.q_norm, a.k_norm, a.inv_freq, pos, k_cache, v_cache, cap, sc.q);
  LILY_CU_LAUNCH();
  const int R = (a.Hq / a.Hkv) * T;
  if (R <= kDecRows) {
    dim3 g2(a.Hkv, nsplit);
    const dim3 th(32 * R);
#define LILY_DEC(HD) launch_pdl(attn_decode_kernel<HD>, g2, th, 0, s, sc.q, proj, ldp, T, a.Hq, a.Hkv, pos, k_cache, v_cache, \
                                cap, nsplit, out, sc.po, sc.pm, sc.pl)
    switch (a.hd) {
      case 64: LILY_DEC(64); break;
      case 128: LILY_DEC(128); break;
      case 256: LILY_DEC(256); break;
      default: fail_internal("attn_core: head_dim must be 64, 128 or 256 on CUDA");
    }
#undef LILY_DEC
  } else if (attn_prefill_supported(a.hd) && !attn_prefill_simt()) {
    attn_prefill(sc.q, proj, ldp, T, a.Hq, a.Hkv, a.hd, pos, k_cache, v_cache, cap, nsplit, out, sc.po, sc.pm, sc.pl, s);
  } else {
  dim3 grid(a.Hkv, cdiv(R, BR), nsplit);
  switch (a.hd) {
    case 64: launch_attn<64>(grid, s, sc.q, proj, ldp, T, a.Hq, a.Hkv, pos, k_cache, v_cache, cap, nsplit, out, sc.po, sc.pm, sc.pl); break;
    case 128: launch_attn<128>(grid, s, sc.q, proj, ldp, T, a.Hq, a.Hkv, pos, k_cache, v_cache, cap, nsplit, out, sc.po, sc.pm, sc.pl); break;
    case 256: launch_attn<256>(grid, s, sc.q, proj, ldp, T, a.Hq, a.Hkv, pos, k_cache, v_cache, cap, nsplit, out, sc.po, sc.pm, sc.pl); break;
    default: fail_internal("attn_core: head_dim must be 64, 128 or 256 on CUDA");
  }
  }
  LILY_CU_LAUNCH();
  if (nsplit > 1) {
    launch_pdl(attn_combine_kernel, dim3(R, a.Hkv, a.hd / 32), dim3(256), 0, s, sc.po, sc.pm, sc.pl, nsplit, T, a.Hq, a.Hkv,
               a.hd, proj, ldp, out);
    LILY_CU_LAUNCH();
  }
}

}  // namespace lily::cuda
