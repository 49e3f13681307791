// Device side of the decode step kernel (mk_kernel.cu only): the Gated DeltaNet tiles and the conv-state
// shift after them.
#pragma once
#include "backend/cuda/mk_ops.cuh"

namespace lily::cuda::mk {

// One DeltaNet tile: value head j, rows [ck·R, ck·R + R) of its state (the stage). DKL = dk / 32.
template <int DKL>
__device__ __forceinline__ void gdn_tile(const Params& p, const OpDesc& op, int opi, int task, int tile, Ring& ring, float* sm, float* red) {
  constexpr int dk = 32 * DKL;
  const GdnArgs& a = op.gdn;
  const DevGroup& gr = group0(p);
  const SlotLite& e = slot_entry(p, op.layer);
  const int dv = a.dv, R = dv / a.nck, G = a.Hv / a.Hk;
  const int j = tile / a.nck, ck = tile % a.nck, hk = j / G;
  const int C = 2 * a.Hk * dk + a.Hv * dv;
  float* conv = e.conv + int64_t(gr.cur) * (a.K - 1) * C;
  const int c = threadIdx.x - 32, lane = threadIdx.x & 31, w = c >> 5;
  float* qs = sm;
  float* ks = sm + dk;
  float* vs = sm + 2 * dk;
  float* gsh = vs + R;  // q scale, k scale, beta, decay
  const int nch = 2 * dk + R;
  if (c < nch) {  // conv + SiLU of the tile's channels; its v channels' conv state shifted at once
    const int ch = c < dk ? hk * dk + c : c < 2 * dk ? a.Hk * dk + hk * dk + (c - dk) : 2 * a.Hk * dk + j * dv + ck * R + (c - 2 * dk);
    const float raw = __ldcg(a.proj + ch);
    float in[4];  // the K <= 4 inputs, oldest first (unrolled: registers)
#pragma unroll
    for (int tp = 0; tp < 4; ++tp) in[tp] = tp < a.K - 1 ? __ldcg(conv + int64_t(tp) * C + ch) : tp == a.K - 1 ? raw : 0.f;
    float acc = 0.f;
#pragma unroll
    for (int tp = 0; tp < 4; ++tp)
      if (tp < a.K) acc = fmaf(a.convw[int64_t(ch) * a.K + tp], in[tp], acc);
    sm[c] = silu(acc);
    if (c >= 2 * dk) {
#pragma unroll
      for (int tp = 0; tp < 3; ++tp)
        if (tp + 1 < a.K) conv[int64_t(tp) * C + ch] = in[tp + 1];
    }
  }
  cbar();
  if (c == 0) {
    signal_release(p, a.readcnt + hk);  // this tile no longer needs the key head's old q/k conv state
    const float bt = __ldcg(a.proj + C + a.Hv * dv + j), at = __ldcg(a.proj + C + a.Hv * dv + a.Hv + j);
    gsh[2] = sigmoid(bt);
    gsh[3] = expf(a.A_neg[j] * softplus(at + a.dt_bias[j]));
  }
  if (w < 2) {  // q and k scales
    const float* v = w == 0 ? qs : ks;
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) ss = fmaf(v[lane + 32 * i], v[lane + 32 * i], ss);
    ss = warp_sum(ss);
    if (lane == 0) gsh[w] = w == 0 ? rsqrtf(ss + 1e-6f) * rsqrtf(float(dk)) : rsqrtf(ss + 1e-6f);
  }
  cbar();
  if (threadIdx.x == 32) trace(p, task, kTrMid);
  const uint8_t* st = ring.wait(p, opi);
  const float qsc = gsh[0], ksc = gsh[1], beta = gsh[2], decay = gsh[3];
  float q[DKL], k[DKL];
#pragma unroll
  for (int i = 0; i < DKL; ++i) { q[i] = qs[DKL * lane + i]; k[i] = ks[DKL * lane + i]; }
  float* Sg = e.S + int64_t(gr.cur) * a.Hv * dv * dk + (int64_t(j) * dv + int64_t(ck) * R) * dk;
  float osq = 0.f;
  for (int r = w; r < R; r += kCW) {
    const float* srow = reinterpret_cast<const float*>(st) + r * dk + DKL * lane;
    float s[DKL];
#pragma unroll
    for (int i = 0; i < DKL; ++i) s[i] = srow[i];
    float sk = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) sk = fmaf(s[i], k[i], sk);
    sk = warp_sum(sk);
    const float cdelta = ksc * beta * (vs[r] - decay * ksc * sk);
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < DKL; ++i) {
      s[i] = fmaf(k[i], cdelta, s[i] * decay);
      sq = fmaf(s[i], q[i], sq);
    }
    const float o = qsc * warp_sum(sq);
    float* gw = Sg + int64_t(r) * dk + DKL * lane;
#pragma unroll
    for (int i = 0; i < DKL; ++i) gw[i] = s[i];
    if (lane == 0) {
      a.out[int64_t(j) * dv + ck * R + r] = o;
      osq += o * o;
    }
  }
  ring.release();
  const float tot = csum(osq, red);
  if (c == 0) a.part[j * a.nck + ck] = tot;
}

// After a DeltaNet task: the tiles that own a key head's q/k conv state (first value head of the key
// head, chunk 0) shift it once every tile of that key head has read it.
template <int DKL>
__device__ __forceinline__ void gdn_conv_owner(const Params& p, const OpDesc& op, int opi, const Task& t) {
  constexpr int dk = 32 * DKL;
  const GdnArgs& a = op.gdn;
  const int G = a.Hv / a.Hk, c = threadIdx.x - 32;
  const SlotLite& e = slot_entry(p, op.layer);
  const int C = 2 * a.Hk * dk + a.Hv * a.dv;
  float* conv = e.conv + int64_t(group0(p).cur) * (a.K - 1) * C;
  for (int tile = t.t0; tile < t.t1; ++tile) {
    const int j = tile / a.nck, ck = tile % a.nck;
    if (ck != 0 || j % G != 0) continue;
    const int hk = j / G;
    if (c == 0) wait_counter(p, a.readcnt + hk, uint32_t(G * a.nck), opi, 5);
    cbar();
    if (c < 2 * dk) {
      const int ch = c < dk ? hk * dk + c : a.Hk * dk + hk * dk + (c - dk);
      for (int tp = 0; tp + 1 < a.K; ++tp)
        conv[int64_t(tp) * C + ch] = tp + 2 < a.K ? __ldcg(conv + int64_t(tp + 1) * C + ch) : __ldcg(a.proj + ch);
    }
    cbar();
  }
}

}  // namespace lily::cuda::mk
