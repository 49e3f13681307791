// Device side of the decode step kernel (mk_kernel.cu only): attention splits (q/k norm, RoPE, online
// softmax over the cached and the new key) and the merge of a query head's splits with its gate.
#pragma once
#include "backend/cuda/mk_ops.cuh"

namespace lily::cuda::mk {

// q/k RMSNorm + partial NeoX RoPE of one head vector (raw in v[0, HD)), into y (scaled); one warp.
template <int HD>
__device__ __forceinline__ void norm_rope_warp(const float* v, const float* nw, float eps, int rot, int64_t pos,
                                               const float* inv_freq_tab, float theta, float scale, float* y, bool bf16_round) {
  const int lane = threadIdx.x & 31;
  float ss = 0.f;
  for (int d = lane; d < HD; d += 32) ss = fmaf(v[d], v[d], ss);
  const float inv = rsqrtf(warp_sum(ss) / float(HD) + eps);
  const int half = rot / 2;
  for (int d = lane; d < HD; d += 32) {
    float val = v[d] * inv * nw[d];
    if (d < rot) {
      const int i = d < half ? d : d - half;
      const float f = inv_freq_tab ? inv_freq_tab[i] : 1.f / powf(theta, float(2 * i) / float(rot));
      float sn, cs;
      sincosf(float(pos) * f, &sn, &cs);
      const int pd = d < half ? d + half : d - half;
      const float other = v[pd] * inv * nw[pd];
      val = d < half ? val * cs - other * sn : val * cs + other * sn;
    }
    val *= scale;
    y[d] = bf16_round ? __bfloat162float(__float2bfloat16_rn(val)) : val;
  }
}

// Online softmax over nk keys (rows of K and V, bf16 or float) for the G query heads in q; o: this
// thread's float4 outputs (element 4·(c + kCT·m) of [G][HD]).
template <int HD, typename KT>
__device__ __forceinline__ void attn_keys(const float* q, const KT* Kr, const KT* Vr, int nk, int G, int kc, float* sc, float* mst, float* lst,
                          float* corr, float4 (&o)[kMaxOv]) {
  const int c = threadIdx.x - 32, lane = threadIdx.x & 31, w = c >> 5;
  constexpr int PL = HD / 32;  // elements per lane
  for (int kk = w; kk < nk; kk += kCW) {
    float kv[PL];
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      if constexpr (sizeof(KT) == 2) kv[i] = bf(Kr[int64_t(kk) * HD + lane + 32 * i]);
      else kv[i] = Kr[int64_t(kk) * HD + lane + 32 * i];
    }
    for (int h = 0; h < G; ++h) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < PL; ++i) s = fmaf(q[h * HD + lane + 32 * i], kv[i], s);
      s = warp_sum(s);
      if (lane == 0) sc[h * kc + kk] = s;
    }
  }
  cbar();
  for (int h = w; h < G; h += kCW) {  // a warp per head, a lane per key (kc <= 32)
    const float m0 = mst[h];
    const float sv = lane < nk ? sc[h * kc + lane] : -INFINITY;
    const float mx = fmaxf(m0, warp_max(sv));
    const float pe = lane < nk ? expf(sv - mx) : 0.f;
    if (lane < nk) sc[h * kc + lane] = pe;
    const float ls = warp_sum(pe);
    if (lane == 0) {
      const float cr = expf(m0 - mx);
      corr[h] = cr;
      lst[h] = lst[h] * cr + ls;
      mst[h] = mx;
    }
  }
  cbar();
#pragma unroll
  for (int m = 0; m < kMaxOv; ++m) {
    const int e = 4 * (c + kCT * m);
    if (e >= G * HD) break;
    const int h = e / HD, d = e % HD;
    const float cr = corr[h];
    float4 acc = make_float4(o[m].x * cr, o[m].y * cr, o[m].z * cr, o[m].w * cr);
    for (int kk = 0; kk < nk; ++kk) {
      const float pe = sc[h * kc + kk];
      float v0, v1, v2, v3;
      if constexpr (sizeof(KT) == 2) {
        const uint2 u = *reinterpret_cast<const uint2*>(Vr + int64_t(kk) * HD + d);
        v0 = __uint_as_float(u.x << 16); v1 = __uint_as_float(u.x & 0xffff0000u);
        v2 = __uint_as_float(u.y << 16); v3 = __uint_as_float(u.y & 0xffff0000u);
      } else {
        const float4 u = *reinterpret_cast<const float4*>(Vr + int64_t(kk) * HD + d);
        v0 = u.x; v1 = u.y; v2 = u.z; v3 = u.w;
      }
      acc.x = fmaf(pe, v0, acc.x); acc.y = fmaf(pe, v1, acc.y); acc.z = fmaf(pe, v2, acc.z); acc.w = fmaf(pe, v3, acc.w);
    }
    o[m] = acc;
  }
  cbar();  // sc and corr are rewritten by the next keys
}

// One attention split: KV head h, split s of the L = pos + 1 keys (the new key from the projections).
template <int HD>
__device__ __forceinline__ void attn_tile(const Params& p, const OpDesc& op, int opi, int task, int tile, Ring& ring, float* sm) {
  const AttnArgs& a = op.attn;
  const DevGroup& gr = group0(p);
  const SlotLite& e = slot_entry(p, op.layer);
  const int G = a.Hq / a.Hkv, h = tile / a.nsplit, s = tile % a.nsplit;
  const int c = threadIdx.x - 32, w = c >> 5;
  const int64_t pos = gr.pos;
  const SplitKeys k = split_keys(a, pos, s);
  const bool has_new = k.a0 <= pos && pos < k.a1;
  float* q = sm;               // [G][HD]
  float* raw = q + G * HD;     // [HD] scratch: the raw head vector of a warp... per warp below
  float* kn = raw + HD;        // [HD] the new key (bf16-rounded)
  float* vn = kn + HD;         // [HD] the new value
  float* sc = vn + HD;         // [G][kc]
  float* mst = sc + G * a.kc;  // [G]
  float* lst = mst + G;
  float* corr = lst + G;
  const float* pr = a.proj;
  // q of the group's heads: warp h' < G normalises and ropes head h' (raw read from the projections)
  for (int hh = w; hh < G; hh += kCW) {
    const float* src = pr + int64_t(h * G + hh) * 2 * HD;
    float* dst = q + hh * HD;
    for (int d = threadIdx.x & 31; d < HD; d += 32) dst[d] = __ldcg(src + d);
    __syncwarp();
    // in place: read all, then write (each lane reads its elements and their rotation partners first)
    float tmp[HD / 32];
    {
      const int lane = threadIdx.x & 31;
      float ss = 0.f;
      for (int d = lane; d < HD; d += 32) ss = fmaf(dst[d], dst[d], ss);
      const float inv = rsqrtf(warp_sum(ss) / float(HD) + a.eps);
      const int half = a.rot / 2;
      const float scale = rsqrtf(float(HD));
#pragma unroll
      for (int u = 0; u < HD / 32; ++u) {
        const int d = lane + 32 * u;
        float val = dst[d] * inv * a.q_norm[d];
        if (d < a.rot) {
          const int i = d < half ? d : d - half;
          float sn, cs;
          const float fr = a.inv_freq ? a.inv_freq[i] : 1.f / powf(a.theta, float(2 * i) / float(a.rot));
          sincosf(float(pos) * fr, &sn, &cs);
          const int pd = d < half ? d + half : d - half;
          const float other = dst[pd] * inv * a.q_norm[pd];
          val = d < half ? val * cs - other * sn : val * cs + other * sn;
        }
        tmp[u] = val * scale;
      }
      __syncwarp();
#pragma unroll
      for (int u = 0; u < HD / 32; ++u) dst[lane + 32 * u] = tmp[u];
    }
  }
  if (has_new && w == kCW - 1) {  // the new key and value: normalised, roped, rounded to bf16, appended
    const float* ksrc = pr + int64_t(a.Hq) * 2 * HD + int64_t(h) * HD;
    const float* vsrc = pr + int64_t(a.Hq) * 2 * HD + int64_t(a.Hkv) * HD + int64_t(h) * HD;
    for (int d = threadIdx.x & 31; d < HD; d += 32) raw[d] = __ldcg(ksrc + d);
    __syncwarp();
    norm_rope_warp<HD>(raw, a.k_norm, a.eps, a.rot, pos, a.inv_freq, a.theta, 1.f, kn, true);
    uint16_t* kdst = e.k + (int64_t(h) * e.cap + pos) * HD;
    uint16_t* vdst = e.v + (int64_t(h) * e.cap + pos) * HD;
    for (int d = threadIdx.x & 31; d < HD; d += 32) {
      kdst[d] = __bfloat16_as_ushort(__float2bfloat16_rn(kn[d]));
      const __nv_bfloat16 vb = __float2bfloat16_rn(__ldcg(vsrc + d));
      vdst[d] = __bfloat16_as_ushort(vb);
      vn[d] = __bfloat162float(vb);
    }
  }
  if (c < G) {
    mst[c] = -INFINITY;
    lst[c] = 0.f;
  }
  float4 o[kMaxOv];
#pragma unroll
  for (int m = 0; m < kMaxOv; ++m) o[m] = make_float4(0.f, 0.f, 0.f, 0.f);
  cbar();
  if (threadIdx.x == 32) trace(p, task, kTrMid);
  for (int si = 0; si < k.nst; ++si) {
    const uint8_t* st = ring.wait(p, opi);
    const int nk = int(min(int64_t(a.kc), k.old_end - (k.a0 + int64_t(si) * a.kc)));
    const uint16_t* Kr = reinterpret_cast<const uint16_t*>(st);
    const uint16_t* Vr = reinterpret_cast<const uint16_t*>(st + size_t(a.kc) * HD * 2);
    attn_keys<HD>(q, Kr, Vr, nk, G, a.kc, sc, mst, lst, corr, o);
    ring.release();
  }
  if (has_new) attn_keys<HD>(q, kn, vn, 1, G, a.kc, sc, mst, lst, corr, o);
#pragma unroll
  for (int m = 0; m < kMaxOv; ++m) {
    const int el = 4 * (c + kCT * m);
    if (el >= G * HD) break;
    const int hh = el / HD, d = el % HD;
    *reinterpret_cast<float4*>(a.po + (int64_t(h * G + hh) * a.nsplit + s) * HD + d) = o[m];
  }
  if (c < G) {
    a.pm[int64_t(h * G + c) * a.nsplit + s] = mst[c];
    a.pl[int64_t(h * G + c) * a.nsplit + s] = lst[c];
  }
}

// One query head's splits merged and gated: warp w sums splits w, w + kCW, ... for every dim, then the
// warps' partial sums are added.
template <int HD>
__device__ __forceinline__ void attn_merge_tile(const OpDesc& op, int hq, float* sm, float* red) {
  const AttnArgs& a = op.attn;
  const int c = threadIdx.x - 32, lane = threadIdx.x & 31, w = c >> 5, ns = a.nsplit;
  float* part = sm;                // [kCW][HD]
  float* f = part + kCW * HD;      // [ns] weights of the splits
  float* ms = f + ns;              // [ns] maxima
  if (c < ns) ms[c] = __ldcg(a.pm + int64_t(hq) * ns + c);
  cbar();
  float m = -INFINITY;
  for (int s = 0; s < ns; ++s) m = fmaxf(m, ms[s]);
  float lpart = 0.f;
  if (c < ns) {
    const float fs = ms[c] != -INFINITY ? expf(ms[c] - m) : 0.f;
    f[c] = fs;
    lpart = fs * __ldcg(a.pl + int64_t(hq) * ns + c);
  }
  const float l = csum(lpart, red);  // also orders f[]
  float o[HD / 32];
#pragma unroll
  for (int u = 0; u < HD / 32; ++u) o[u] = 0.f;
  for (int s = w; s < ns; s += kCW) {
    const float fs = f[s];
    const float* po = a.po + (int64_t(hq) * ns + s) * HD;
#pragma unroll
    for (int u = 0; u < HD / 32; ++u) o[u] = fmaf(fs, __ldcg(po + lane + 32 * u), o[u]);
  }
#pragma unroll
  for (int u = 0; u < HD / 32; ++u) part[w * HD + lane + 32 * u] = o[u];
  cbar();
  for (int d = c; d < HD; d += kCT) {
    float tot = 0.f;
    for (int k = 0; k < kCW; ++k) tot += part[k * HD + d];
    const float gate = __ldcg(a.proj + int64_t(hq) * 2 * HD + HD + d);
    a.out[int64_t(hq) * HD + d] = (l > 0.f ? tot / l : 0.f) * sigmoid(gate);
  }
}

}  // namespace lily::cuda::mk
