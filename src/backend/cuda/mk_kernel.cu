// The decode step as one persistent kernel (mk.h): producer, consumers per op, and the launcher.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/device_info.h"
#include "backend/cuda/mk_launch.h"
#include "backend/cuda/mk_ops.cuh"

namespace lily::cuda::mk {
namespace {

__device__ __forceinline__ const DevGroup& group0(const Params&) { return s_group; }
__device__ __forceinline__ const SlotLite& slot_entry(const Params&, int layer) { return s_slot[layer]; }

// The op of a task into shared memory: lane i of the calling warp(s) copies 16 bytes.
__device__ __forceinline__ void copy_op(const OpDesc* src, OpDesc* dst, int i) {
  if (i < kOpWords) reinterpret_cast<uint4*>(dst)[i] = __ldg(reinterpret_cast<const uint4*>(src) + i);
}

// Keys of an attention split: [a0, a1) of the L = pos + 1 keys, the cached ones [a0, old_end).
struct SplitKeys {
  int64_t a0, a1, old_end;
  int nst;  // stages of cached keys
};
__device__ __forceinline__ SplitKeys split_keys(const AttnArgs& a, int64_t pos, int s) {
  SplitKeys k;
  const int64_t L = pos + 1;
  const int64_t per = ((L + a.nsplit - 1) / a.nsplit + a.kc - 1) / a.kc * a.kc;
  k.a0 = min(L, int64_t(s) * per);
  k.a1 = min(L, k.a0 + per);
  k.old_end = min(k.a1, pos);
  k.nst = k.old_end > k.a0 ? int((k.old_end - k.a0 + a.kc - 1) / a.kc) : 0;
  return k;
}

// ---- producer -----------------------------------------------------------------------------------
// Copy `ci` of stage `si` of tile `tile` (false: no such copy). Expert ids must be readable (routed).
__device__ __forceinline__ bool stage_copy(const Params& p, const OpDesc& op, int tile, int si, int ci, const void*& src, uint32_t& off,
                           uint32_t& bytes) {
  switch (op.type) {
    case kGdn: {
      if (ci > 0) return false;
      const GdnArgs& a = op.gdn;
      const SlotLite& e = slot_entry(p, op.layer);
      const int R = a.dv / a.nck, j = tile / a.nck, ck = tile % a.nck;
      const int64_t S_n = int64_t(a.Hv) * a.dv * a.dk;
      src = e.S + int64_t(group0(p).cur) * S_n + (int64_t(j) * a.dv + int64_t(ck) * R) * a.dk;
      off = 0;
      bytes = uint32_t(R * a.dk * 4);
      return true;
    }
    case kAttnSplit: {
      if (ci > 1) return false;
      const AttnArgs& a = op.attn;
      const SlotLite& e = slot_entry(p, op.layer);
      const int h = tile / a.nsplit;
      const SplitKeys k = split_keys(a, group0(p).pos, tile % a.nsplit);
      const int64_t k0 = k.a0 + int64_t(si) * a.kc;
      const int64_t nk = min(int64_t(a.kc), k.old_end - k0);
      src = (ci == 0 ? e.k : e.v) + (int64_t(h) * e.cap + k0) * a.hd;
      off = ci == 0 ? 0u : uint32_t(a.kc * a.hd * 2);
      bytes = uint32_t(nk * a.hd * 2);
      return true;
    }
    default: break;
  }
  // GEMV class: rows [r0, r0 + nv) of each part's matrix
  const bool affine = op.m.bits != 0;
  const int per_part = affine ? 3 : 1;
  const int part = ci / per_part, what = ci % per_part;
  int r0, nv, parts;
  int64_t e = 0, row0;
  if (op.type == kExpertGu) {
    const int rtiles = (op.out + op.rows - 1) / op.rows;
    const int slot = gu_slot(op, tile, rtiles);
    r0 = (tile % rtiles) * op.rows;
    parts = 2;
    if (part >= parts) return false;
    e = slot == op.shared_slot ? op.shared_e : __ldcg(op.experts + slot);
    row0 = r0 + (part == 1 ? op.out : 0);  // gate rows, then up rows
  } else {
    r0 = tile * op.rows;
    parts = op.in_kind == kInConcat ? op.parts : 1;
    if (part >= parts) return false;
    if (op.type == kExpertDown) e = part == op.shared_slot ? op.shared_e : __ldcg(op.experts + part);
    row0 = r0;
  }
  nv = min(op.rows, op.out - r0);
  const uint32_t codes_b = uint32_t(int64_t(op.parts) * op.rows * op.m.row_b);
  if (what == 0) {
    src = op.m.w + e * op.m.e_b + row0 * op.m.row_b;
    off = uint32_t(int64_t(part) * op.rows * op.m.row_b);
    bytes = uint32_t(int64_t(nv) * op.m.row_b);
  } else {  // from the 16-byte unit holding the first scale (experts' scale blocks are 16-byte aligned)
    const uint32_t sc_row = scale_row_bytes(op.rows, op.m.ng), skip = scale_skip(row0, op.m.ng);
    const uint8_t* first = reinterpret_cast<const uint8_t*>((what == 1 ? op.m.s : op.m.b) + e * op.m.e_s + row0 * op.m.ng);
    src = first - skip;
    off = codes_b + (what == 2 ? uint32_t(op.parts) * sc_row : 0u) + uint32_t(part) * sc_row;
    bytes = (skip + uint32_t(nv) * uint32_t(op.m.ng) * 2u + 15u) / 16u * 16u;
  }
  return true;
}

__device__ __forceinline__ void producer(const Params& p, const Task* tk, int nt, int task0, uint8_t* ring, uint64_t* full, uint64_t* empty) {
  const int lane = threadIdx.x & 31;
  const uint32_t NS = uint32_t(p.stages);
  const uint64_t pol = l2_evict_first();
  uint32_t g = 0;
  Task next = nt > 0 ? tk[0] : Task{};
  for (int ti = 0; ti < nt; ++ti) {
    const Task t = next;
    if (ti + 1 < nt) next = tk[ti + 1];
    __syncwarp();
    copy_op(p.ops + t.op, &s_op_p, lane);
    __syncwarp();
    const OpDesc& op = s_op_p;
    if (op.stage_bytes == 0) continue;
    if (lane == 0) trace(p, task0 + ti, kTrIssue0);
    unsigned long long free_wait = 0;
    bool routed = op.stage_dep < 0;
    for (int tile = t.t0; tile < t.t1; ++tile) {
      int nst = 1;
      if (op.type == kAttnSplit) nst = split_keys(op.attn, group0(p).pos, tile % op.attn.nsplit).nst;
      if (!routed) {  // expert tiles: the routing first (gate‖up tiles of the shared expert need none)
        const bool shared_only =
            op.type == kExpertGu && gu_slot(op, tile, (op.out + op.rows - 1) / op.rows) == op.shared_slot;
        if (!shared_only) {
          if (lane == 0) wait_counter(p, op.stage_dep, 1, t.op, 2);
          __syncwarp();
          routed = true;
        }
      }
      for (int si = 0; si < nst; ++si, ++g) {
        const uint32_t s = g % NS;
        if (lane == 0) {
          const uint32_t par = ((g / NS) & 1u) ^ 1u;
          if (p.step.trace && !mbar_try_wait(&empty[s], par)) {
            const unsigned long long t0 = now_ns();
            mbar_wait_timed(p, &empty[s], par, t.op, 4);
            free_wait += now_ns() - t0;
          } else {
            mbar_wait_timed(p, &empty[s], par, t.op, 4);
          }
        }
        __syncwarp();
        fence_proxy_async_smem();
        uint8_t* dst = ring + size_t(s) * p.stage_bytes;
        uint32_t mine = 0;
        for (int ci = lane;; ci += 32) {
          const void* src;
          uint32_t off, bytes;
          if (!stage_copy(p, op, tile, si, ci, src, off, bytes)) break;
          mine += bytes;
        }
        const uint32_t total = __reduce_add_sync(0xffffffffu, mine);
        if (lane == 0) mbar_expect_tx(&full[s], total);
        __syncwarp();
        for (int ci = lane;; ci += 32) {
          const void* src;
          uint32_t off, bytes;
          if (!stage_copy(p, op, tile, si, ci, src, off, bytes)) break;
          if (bytes) bulk_copy_hint(dst + off, src, bytes, &full[s], pol);
        }
      }
    }
    if (lane == 0) {
      trace(p, task0 + ti, kTrIssue1);
      if (p.step.trace) p.step.trace[int64_t(task0 + ti) * kTraceWords + kTrFreeWait] = free_wait;
    }
  }
}

// ---- consumers ----------------------------------------------------------------------------------
// GEMV class (gemv, router, expert gate‖up, expert down, head): stage the input once, then the tiles.
// best: the head's argmax key over this thread's rows.
template <int MODE>
__device__ __forceinline__ void gemv_task(const Params& p, const OpDesc& op, const Task& t, int task, Ring& ring, float* stg,
                                          float* red, unsigned long long& best) {
  const TileGeo tg = tile_geo(op);
  const Staged sg = staged_regions<MODE>(stg, (op.in_kind == kInConcat ? op.parts : 1) * op.in);
  stage_input<MODE>(op, sg, red);
  if (threadIdx.x == 32) trace(p, task, kTrMid);
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) - 1;
  const int rtiles = op.type == kExpertGu ? (op.out + op.rows - 1) / op.rows : 0;
  for (int tile = t.t0; tile < t.t1; ++tile) {
    const uint8_t* st = ring.wait(p, t.op);
    int r0, slot = 0;
    if (op.type == kExpertGu) {
      slot = gu_slot(op, tile, rtiles);
      r0 = (tile % rtiles) * op.rows;
    } else {
      r0 = tile * op.rows;
    }
    const int nv = min(op.rows, op.out - r0);
    const uint32_t skip0 = scale_skip(r0, op.m.ng), skip1 = scale_skip(int64_t(op.out) + r0, op.m.ng);
    float acc[kMaxRpw][2] = {};
    if (p.step.skip_dots) {
    } else if (op.type == kExpertGu) {
      tile_dots<MODE, 2, false>(tg, st, sg.xs, sg.colX, nv, skip0, skip1, acc);
    } else if (op.in_kind == kInConcat) {
      tile_dots<MODE, 1, true>(tg, st, sg.xs, sg.colX, nv, skip0, skip0, acc);
    } else {
      tile_dots<MODE, 1, false>(tg, st, sg.xs, sg.colX, nv, skip0, skip0, acc);
    }
    ring.release();
    // every lane holds the warp's sums: lane j writes the warp's row j (one round trip for all of them)
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxRpw; ++j)
      if (j == lane) {
        a0 = acc[j][0];
        a1 = acc[j][1];
      }
    const int r = w + kCW * lane;
    if (lane < kMaxRpw && r < nv) {
      const int row = r0 + r;
      if (op.type == kExpertGu) {
        op.y[int64_t(slot) * op.out + row] = silu(a0) * a1;
      } else {
        const float v = op.accumulate ? __ldcg(op.y + row) + a0 : a0;
        op.y[row] = v;
        if (op.type == kHead) best = max(best, mk_argmax_key(v, row));
      }
    }
  }
}

// Router: after its tiles, the task that finishes last runs the top-k and sets the routed counter.
__device__ __forceinline__ void router_finish(const Params& p, const OpDesc& op, int* flag) {
  const int c = threadIdx.x - 32;
  cbar();
  if (c == 0) *flag = signal(p, op.done) + 1 == uint32_t(op.ntasks) ? 1 : 0;
  cbar();
  if (*flag && c < 32) {
    __threadfence();
    TopkArgs ta;
    ta.E = op.route.E; ta.k = op.route.k; ta.norm_topk = op.route.norm_topk != 0; ta.shared = op.route.shared != 0;
    ta.shared_gated = op.route.gated != 0; ta.idx = op.route.idx; ta.w = op.route.w;
    topk_warp(op.y, 0, ta);
    __syncwarp();
    if (c == 0) signal(p, op.route.routed);
  }
}

// Head: the block's best key into a slot of the op's key array; the last task writes the id.
__device__ __forceinline__ void head_finish(const Params& p, const OpDesc& op, unsigned long long best, unsigned long long* redk, int* flag) {
  const int c = threadIdx.x - 32, lane = threadIdx.x & 31, w = c >> 5;
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  if (lane == 0) redk[w] = best;
  cbar();
  if (c == 0) {
    unsigned long long k = 0ull;
    for (int i = 0; i < kCW; ++i) k = max(k, redk[i]);
    const uint32_t slot = atomicAdd(p.counters + op.head.index, 1u);
    op.head.keys[slot] = k;
    *flag = signal(p, op.done) + 1 == uint32_t(op.ntasks) ? 1 : 0;
  }
  cbar();
  if (*flag && c < 32) {
    __threadfence();
    unsigned long long k = 0ull;
    for (int i = lane; i < op.ntasks; i += 32) k = max(k, __ldcg(op.head.keys + i));
    for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, o));
    if (lane == 0 && op.head.ids) {
      const int32_t id = k ? int32_t(~uint32_t(k & 0xffffffffu)) : 0;
      op.head.ids[0] = id;
      if (op.head.feed && p.step.fed) p.step.fed[group0(p).slot] = id;
    }
  }
}

__device__ __forceinline__ void embed_task(const Params& p, const OpDesc& op) {
  const int c = threadIdx.x - 32;
  int64_t tok = p.step.tokens[0];
  if (tok < 0 && p.step.fed) tok = p.step.fed[group0(p).slot];
  const WMat& m = op.m;
  for (int i = c; i < op.out; i += kCT) {
    float v;
    if (m.bits == 0) {
      v = bf(reinterpret_cast<const uint16_t*>(m.w + tok * m.row_b)[i]);
    } else {
      const int64_t bit = int64_t(i) * m.bits;
      const uint32_t word = reinterpret_cast<const uint32_t*>(m.w + tok * m.row_b)[bit >> 5];
      const uint32_t code = (word >> (bit & 31)) & ((1u << m.bits) - 1u);
      const int64_t gi = tok * m.ng + i / m.gs;
      v = bf(m.s[gi]) * float(code) + bf(m.b[gi]);
    }
    op.y[i] = v;
  }
}

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

// The consumers' part of task `task` (the block's ti-th). Its op is in s_op_c[ti & 1] (copied during the
// previous task); warp 1 requests the next task's op (next_op, -1: none) at the start and stores it at the end.
__device__ __forceinline__ void run_task(const Params& p, const Task& t, int task, int ti, int next_op, Ring& ring, float* stg, float* red,
                         unsigned long long* redk, int* flag) {
  const OpDesc& op = s_op_c[ti & 1];
  const int c = threadIdx.x - 32;
  uint4 nxt = make_uint4(0, 0, 0, 0);
  if (c >= 32 && c < 32 + kOpWords && next_op >= 0) nxt = __ldg(reinterpret_cast<const uint4*>(p.ops + next_op) + (c - 32));
  ring.waited = 0;
  if (c == 0) {
    trace(p, task, kTrStart);
    for (int d = 0; d < kMaxDeps; ++d)
      if (op.dep[d] >= 0) wait_counter(p, op.dep[d], op.dep_n[d], t.op, 1);
    trace(p, task, kTrDeps);
  }
  cbar();
  bool signaled = false;
  switch (op.type) {
    case kEmbed:
      embed_task(p, op);
      break;
    case kGemv:
    case kRouter:
    case kExpertGu:
    case kExpertDown:
    case kHead: {
      unsigned long long best = 0ull;
      if (op.m.bits == 0) gemv_task<0>(p, op, t, task, ring, stg, red, best);
      else if (op.m.bits == 4) gemv_task<4>(p, op, t, task, ring, stg, red, best);
      else gemv_task<8>(p, op, t, task, ring, stg, red, best);
      if (op.type == kRouter) {
        router_finish(p, op, flag);
        signaled = true;
      } else if (op.type == kHead) {
        head_finish(p, op, best, redk, flag);
        signaled = true;
      }
      break;
    }
    case kGdn: {
      const int DKL = op.gdn.dk / 32;
      for (int tile = t.t0; tile < t.t1; ++tile) {
        if (DKL == 4) gdn_tile<4>(p, op, t.op, task, tile, ring, stg, red);
        else if (DKL == 2) gdn_tile<2>(p, op, t.op, task, tile, ring, stg, red);
        else gdn_tile<1>(p, op, t.op, task, tile, ring, stg, red);
      }
      if (DKL == 4) gdn_conv_owner<4>(p, op, t.op, t);
      else if (DKL == 2) gdn_conv_owner<2>(p, op, t.op, t);
      else gdn_conv_owner<1>(p, op, t.op, t);
      break;
    }
    case kAttnSplit:
      for (int tile = t.t0; tile < t.t1; ++tile) {
        if (op.attn.hd == 256) attn_tile<256>(p, op, t.op, task, tile, ring, stg);
        else if (op.attn.hd == 128) attn_tile<128>(p, op, t.op, task, tile, ring, stg);
        else attn_tile<64>(p, op, t.op, task, tile, ring, stg);
      }
      break;
    case kAttnMerge:
      for (int tile = t.t0; tile < t.t1; ++tile) {
        if (op.attn.hd == 256) attn_merge_tile<256>(op, tile, stg, red);
        else if (op.attn.hd == 128) attn_merge_tile<128>(op, tile, stg, red);
        else attn_merge_tile<64>(op, tile, stg, red);
        cbar();
      }
      break;
    default:
      break;
  }
  if (c >= 32 && c < 32 + kOpWords && next_op >= 0) reinterpret_cast<uint4*>(&s_op_c[(ti + 1) & 1])[c - 32] = nxt;
  if (!signaled) {
    cbar();
    if (c == 0) signal_release(p, op.done);
  } else {
    cbar();
  }
  if (c == 0) {
    trace(p, task, kTrEnd);
    if (p.step.trace) p.step.trace[int64_t(task) * kTraceWords + kTrStageWait] = ring.waited;
  }
}

__global__ void __launch_bounds__(kThreads, 1) mk_kernel(const Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
  __shared__ float red[32];
  __shared__ unsigned long long redk[kCW];
  __shared__ int flag, last;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    mbar_init_fence();
  }
  if (threadIdx.x == 0) s_group = *static_cast<const DevGroup*>(p.step.groups);
  __syncthreads();
  for (int l = threadIdx.x; l < p.step.layers; l += blockDim.x) {
    const DevSlotLayer& e = static_cast<const DevSlotLayer*>(p.step.slots)[int64_t(l) * p.step.slot_cap + s_group.slot];
    s_slot[l] = SlotLite{e.k, e.v, e.conv, e.S, e.cap};
  }
  __syncthreads();
  const Task* tk = p.tasks + p.task_begin[blockIdx.x];
  const int nt = p.task_begin[blockIdx.x + 1] - p.task_begin[blockIdx.x];
  uint8_t* ring = smem;
  float* stg = reinterpret_cast<float*>(smem + size_t(p.stages) * p.stage_bytes);
  const int task0 = p.task_begin[blockIdx.x];
  if (threadIdx.x < 32) {
    producer(p, tk, nt, task0, ring, full, empty);
  } else {
    Ring r{ring, full, empty, p.stage_bytes, p.stages};
    Task next = nt > 0 ? tk[0] : Task{};
    if (nt > 0) copy_op(p.ops + next.op, &s_op_c[0], int(threadIdx.x) - 32);
    cbar();
    for (int ti = 0; ti < nt; ++ti) {
      const Task t = next;
      if (ti + 1 < nt) next = tk[ti + 1];
      run_task(p, t, task0 + ti, ti, ti + 1 < nt ? next.op : -1, r, stg, red, redk, &flag);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(p.counters + p.n_counters - 1, 1u) == gridDim.x - 1 ? 1 : 0;
  }
  __syncthreads();
  if (last) {  // every block is done: the counters start from zero in the next step
    __threadfence();
    for (int i = threadIdx.x; i < p.n_counters; i += blockDim.x) p.counters[i] = 0u;
  }
}

size_t al256(size_t b) { return (b + 255) & ~size_t(255); }

}  // namespace

int blocks() { return device_sm_count(); }

DevPlan upload(const Plan& pl) {
  if (!pl.finalized()) fail_internal("mk::upload: the plan is not finalized");
  DevPlan d;
  d.blocks = int(pl.task_begin().size()) - 1;
  d.n_counters = pl.counters();
  d.n_ops = int(pl.ops().size());
  d.stage_bytes = (pl.stage_bytes() + 127) / 128 * 128;
  const size_t b_ops = al256(sizeof(OpDesc) * pl.ops().size()), b_tasks = al256(sizeof(Task) * std::max<size_t>(1, pl.tasks().size())),
               b_tb = al256(sizeof(int32_t) * pl.task_begin().size()), b_cnt = al256(4 * size_t(d.n_counters)),
               b_err = al256(4 * kErrWords);
  d.bytes = b_ops + b_tasks + b_tb + b_cnt + b_err;
  int dev = 0, optin = 0;
  LILY_CU(cudaGetDevice(&dev));
  LILY_CU(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes fa{};
  LILY_CU(cudaFuncGetAttributes(&fa, mk_kernel));  // its static shared memory: barriers, ops, slot rows
  const size_t fixed = (fa.sharedSizeBytes + 127) / 128 * 128 + 128;
  const size_t staging = (pl.staging_floats() * 4 + 127) / 128 * 128;
  const size_t avail = size_t(optin) - fixed - staging;
  d.stages = d.stage_bytes ? int(std::min<size_t>(kMaxStages, avail / d.stage_bytes)) : 1;
  if (d.stages < 2 && d.stage_bytes)
    fail_internal("mk::upload: the ring needs two stages of shared memory; the plan's stages or staging are too large");
  d.smem = size_t(d.stages) * d.stage_bytes + staging;
  LILY_CU(cudaMalloc(&d.mem, d.bytes));
  char* base = static_cast<char*>(d.mem);
  d.ops = reinterpret_cast<const OpDesc*>(base);
  d.tasks = reinterpret_cast<const Task*>(base + b_ops);
  d.task_begin = reinterpret_cast<const int32_t*>(base + b_ops + b_tasks);
  d.counters = reinterpret_cast<uint32_t*>(base + b_ops + b_tasks + b_tb);
  d.err = reinterpret_cast<uint32_t*>(base + b_ops + b_tasks + b_tb + b_cnt);
  LILY_CU(cudaMemcpy(base, pl.ops().data(), sizeof(OpDesc) * pl.ops().size(), cudaMemcpyHostToDevice));
  if (!pl.tasks().empty())
    LILY_CU(cudaMemcpy(base + b_ops, pl.tasks().data(), sizeof(Task) * pl.tasks().size(), cudaMemcpyHostToDevice));
  LILY_CU(cudaMemcpy(base + b_ops + b_tasks, pl.task_begin().data(), sizeof(int32_t) * pl.task_begin().size(),
                     cudaMemcpyHostToDevice));
  LILY_CU(cudaMemset(base + b_ops + b_tasks + b_tb, 0, b_cnt + b_err));
  static bool attr = false;
  if (!attr) {
    LILY_CU(cudaFuncSetAttribute(mk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(size_t(optin) - fixed)));
    attr = true;
  }
  return d;
}

void release(DevPlan& d) {
  if (d.mem) cudaFree(d.mem);
  d = DevPlan{};
}

void launch(const DevPlan& d, const StepArgs& step, cudaStream_t s) {
  Params p{};
  p.ops = d.ops;
  p.tasks = d.tasks;
  p.task_begin = d.task_begin;
  p.counters = d.counters;
  p.n_counters = d.n_counters;
  p.err = d.err;
  p.step = step;
  p.stage_bytes = d.stage_bytes;
  p.stages = d.stages;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1] = {};
  cfg.gridDim = dim3(unsigned(d.blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = d.smem;
  cfg.stream = s;
  attr[0].id = cudaLaunchAttributeCooperative;  // every block resident at once: blocks wait on each other
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  LILY_CU(cudaLaunchKernelEx(&cfg, mk_kernel, p));
  LILY_CU_LAUNCH();
}

std::string record_message(uint32_t* record, const Plan& pl) {
  volatile uint32_t* r = record;
  if (!r || r[kErrCode] == 0) return "";
  uint32_t e[kErrWords];
  for (int i = 0; i < kErrWords; ++i) {
    e[i] = r[i];
    r[i] = 0;
  }
  static const char* what[] = {"?", "an op's inputs", "the routing (producer)", "a stage (consumer)", "a free stage (producer)",
                               "the readers of a DeltaNet conv state"};
  const int op = int(e[kErrOp]);
  const OpDesc* o = op >= 0 && op < int(pl.ops().size()) ? &pl.ops()[size_t(op)] : nullptr;
  return "decode step kernel: block " + std::to_string(e[kErrBlock]) + " waited too long for " +
         what[e[kErrCode] < 6 ? e[kErrCode] : 0] + " at op " + std::to_string(op) + " (" + (o ? op_name(o->type) : "?") +
         ", layer " + std::to_string(o ? o->layer : -1) + "), last value " + std::to_string(e[kErrValue]);
}

}  // namespace lily::cuda::mk
