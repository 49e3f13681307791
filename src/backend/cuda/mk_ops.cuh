// Device side of the decode step kernel (mk_kernel.cu): the block's shape, the ring of stages, waits on
// counters, and each op's consumer part. Included by mk_kernel.cu only.
//
// Block: warp 0 produces (streams stages), warps 1..kCW consume. Consumer thread c = threadIdx.x - 32.
// Data written by other blocks of the same launch is read with ld.global.cg (L2; L1 is not coherent),
// after an acquire on the counter that says it is complete. Waits never give up: a wait that outlasts
// kTimeout reports and traps (report below).
#pragma once
#include "backend/cuda/affine_dot.cuh"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/mk.h"
#include "backend/cuda/step_desc.h"
#include "backend/cuda/tma.cuh"

namespace lily::cuda::mk {

// 512 threads in all: ptxas then allows 128 registers a thread (with 544 it allowed 96).
constexpr int kCW = kConsumerWarps;  // consumer warps (15)
constexpr int kCT = 32 * kCW;       // consumer threads
constexpr int kThreads = kCT + 32;  // and the producer warp
constexpr int kMaxStages = 8;
constexpr int kMaxV = 5;    // float4 of staged input per consumer thread
constexpr int kMaxRpw = 3;  // tile rows per consumer warp
constexpr int kMaxOv = 3;   // float4 attention outputs per consumer thread
static_assert(4 * kCT * kMaxV >= kMaxStagedInputs, "staging registers");
static_assert(kCW * kMaxRpw >= kMaxTileRows, "tile rows");
static_assert(4 * kCT * kMaxOv >= kMaxAttnOutputs, "attention outputs");
constexpr long long kTimeout = 20000000000ll;  // clock cycles a wait may take (~10 s) before the kernel traps

struct Params {
  const OpDesc* ops;
  const Task* tasks;
  const int32_t* task_begin;
  uint32_t* counters;
  int32_t n_counters;
  uint32_t* err;
  StepArgs step;
  uint32_t stage_bytes;
  int32_t stages;
};

// A slot-table row as the kernel reads it (one per layer, for the step's sequence), and the op of the task
// the consumers (the producer) work on, in shared memory: read once per block, not per access.
struct SlotLite {
  uint16_t *k, *v;
  float *conv, *S;
  int64_t cap;
};
__shared__ DevGroup s_group;
__shared__ SlotLite s_slot[kMaxLayers];
__shared__ OpDesc s_op_c[2], s_op_p;  // consumers: the current task's op and the next one's (prefetched)
constexpr int kOpWords = int(sizeof(OpDesc) / 16);
static_assert(sizeof(OpDesc) % 16 == 0 && kOpWords <= 32, "OpDesc copies: one uint4 per lane");

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void trace(const Params& p, int task, int word) {
  if (p.step.trace) p.step.trace[int64_t(task) * kTraceWords + word] = now_ns();
}

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// A wait that times out is a bug (a miscounted stage or dependency): its record goes to the host-mapped
// error words (StepArgs::host_err) and the kernel traps, so the host sees a failed step instead of a hang.
__device__ __forceinline__ void report(const Params& p, uint32_t code, int op, uint32_t value) {
  if (atomicCAS(p.err + kErrCode, 0u, code) == 0u) {
    p.err[kErrOp] = uint32_t(op);
    p.err[kErrBlock] = blockIdx.x;
    p.err[kErrValue] = value;
    if (p.step.host_err) {
      volatile uint32_t* h = p.step.host_err;
      h[kErrOp] = uint32_t(op);
      h[kErrBlock] = blockIdx.x;
      h[kErrValue] = value;
      __threadfence_system();
      h[kErrCode] = code;
      __threadfence_system();
    }
  }
  __trap();
}
// Spins until counter c >= n.
__device__ __forceinline__ void wait_counter(const Params& p, int c, uint32_t n, int op, uint32_t code) {
  long long t0 = 0;
  for (uint32_t spins = 0;; ++spins) {
    const uint32_t v = ld_acquire(p.counters + c);
    if (v >= n) return;
    if (spins == 64) t0 = clock64();
    if (spins > 64 && (spins & 63u) == 0u && clock64() - t0 > kTimeout) report(p, code, op, v);
  }
}
// Adds one to counter c after this thread's (and, after a barrier, the block's) writes; returns the old value.
__device__ __forceinline__ uint32_t signal(const Params& p, int c) {
  __threadfence();
  return atomicAdd(p.counters + c, 1u);
}
// The same without the old value: a release reduction, no round trip.
__device__ __forceinline__ void signal_release(const Params& p, int c) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.counters + c) : "memory");
}
__device__ __forceinline__ void mbar_wait_timed(const Params& p, uint64_t* bar, uint32_t parity, int op, uint32_t code) {
  long long t0 = 0;
  for (uint32_t spins = 0; !mbar_try_wait(bar, parity); ++spins) {
    if (spins == 16) t0 = clock64();
    if (spins > 16 && (spins & 255u) == 0u && clock64() - t0 > kTimeout) report(p, code, op, parity);
  }
}

__device__ __forceinline__ void cbar() { asm volatile("bar.sync 1, %0;" ::"n"(kCT) : "memory"); }

// Sum over the consumer threads (every one gets it); red: >= kCW floats of shared memory.
__device__ __forceinline__ float csum(float v, float* red) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) - 1;
  v = warp_sum(v);
  cbar();
  if (lane == 0) red[w] = v;
  cbar();
  return warp_sum(lane < kCW ? red[lane] : 0.f);
}

__device__ __forceinline__ float4 ldcg4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }

// Order-preserving key of (logit, index): larger logits win, then lower indices; NaN never wins; 0: none.
__device__ __forceinline__ unsigned long long mk_argmax_key(float v, int i) {
  if (v != v) return 0ull;
  uint32_t b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(b) << 32) | uint32_t(~uint32_t(i));
}

// ---- the ring, consumer side -------------------------------------------------------------------
struct Ring {
  uint8_t* base;
  uint64_t* full;
  uint64_t* empty;
  uint32_t bytes;  // per stage
  int n;           // stages
  uint32_t g = 0;  // stages consumed so far (the block's sequence)
  unsigned long long waited = 0;  // ns consumer thread 0 waited for stages (traced steps)
  // Stage gi of the block's sequence, once it has landed (every calling thread waits).
  __device__ const uint8_t* wait_at(const Params& p, int op, uint32_t gi) {
    const int s = int(gi % uint32_t(n));
    const uint32_t par = (gi / uint32_t(n)) & 1u;
    if (p.step.trace && threadIdx.x == 32 && !mbar_try_wait(&full[s], par)) {
      const unsigned long long t = now_ns();
      mbar_wait_timed(p, &full[s], par, op, 3);
      waited += now_ns() - t;
    } else {
      mbar_wait_timed(p, &full[s], par, op, 3);
    }
    return base + size_t(s) * bytes;
  }
  // Stage gi may be overwritten (one arrival: the one thread done with it, after the readers' barrier).
  __device__ void free_at(uint32_t gi) { mbar_arrive(&empty[gi % uint32_t(n)]); }
  // The block's next stage, read by every consumer thread together.
  __device__ const uint8_t* wait(const Params& p, int op) { return wait_at(p, op, g); }
  __device__ void release() {
    cbar();
    if (threadIdx.x == 32) free_at(g);
    ++g;
  }
};

// ---- GEMV class: staging ------------------------------------------------------------------------
// Staged input regions of a GEMV-class op (floats from the start of the staging area), by MODE: 0 (bf16
// weights) xs [nel] plain; 4 / 8 (affine) xs in the column layout of xs_at, colX [ncol] (Σx per 16-byte
// column). staged_floats (mk.h) counts them.
struct Staged {
  float* xs;
  float* colX;
};
template <int MODE>
__device__ __forceinline__ Staged staged_regions(float* stg, int nel) {
  constexpr int C = MODE == 0 ? 8 : 128 / MODE;
  const int ncol = nel / C;
  return Staged{stg, stg + (ncol + 31) / 32 * 32 * C};
}

template <int MODE>
__device__ __forceinline__ void stage_input(const OpDesc& op, const Staged& sg, float* red) {
  const int c = threadIdx.x - 32;
  const int nel = (op.in_kind == kInConcat ? op.parts : 1) * op.in;
  float* xs = sg.xs;
  auto at = [](int e) {  // e % 4 == 0: 4 contiguous floats
    if constexpr (MODE == 0) return e;
    else return xs_at<MODE>(e);
  };
  // pass 1: every float4 of the input (normalised inputs raw, their Σx² on the way) into xs
  float ss = 0.f;
  for (int e = 4 * c; e < nel; e += 4 * kCT) {
    float4 v;
    if (op.in_kind == kInConcat) {
      const int part = e / op.in;
      const float4 h = ldcg4(op.x + e);  // h rows of the parts are contiguous: [parts][in]
      const float w = __ldcg(op.aux0 + part);
      v = make_float4(w * h.x, w * h.y, w * h.z, w * h.w);
    } else if (op.in_kind == kInGdnGated) {
      const int dv = op.gated_dv, j = e / dv, d = e % dv;
      float tot = 0.f;
      for (int k = 0; k < op.gated_nck; ++k) tot += __ldcg(op.aux1 + j * op.gated_nck + k);
      const float inv = rsqrtf(tot / float(dv) + op.eps);
      const float4 o = ldcg4(op.x + e), z = ldcg4(op.aux0 + e), w = __ldg(reinterpret_cast<const float4*>(op.norm_w + d));
      v = make_float4(o.x * inv * w.x * silu(z.x), o.y * inv * w.y * silu(z.y), o.z * inv * w.z * silu(z.z),
                      o.w * inv * w.w * silu(z.w));
    } else {
      v = ldcg4(op.x + e);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    *reinterpret_cast<float4*>(xs + at(e)) = v;
  }
  const float inv = op.in_kind == kInNorm ? rsqrtf(csum(ss, red) / float(nel) + op.eps) : 1.f;  // (csum: a barrier)
  if (op.in_kind != kInNorm) cbar();
  // pass 2: the norm applied (each thread its own float4s), Σx per 16-byte column (affine)
  for (int base = 4 * 32 * (c >> 5); base < nel; base += 4 * kCT) {  // warp-uniform: a warp's 128 elements
    const int e = base + 4 * (c & 31);
    const bool in = e < nel;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (in) {
      float4* px = reinterpret_cast<float4*>(xs + at(e));
      v = *px;
      if (op.in_kind == kInNorm) {
        const float4 w = __ldg(reinterpret_cast<const float4*>(op.norm_w + e));
        v = make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
        *px = v;
      }
    }
    if constexpr (MODE != 0) {
      constexpr int C = 128 / MODE;  // nel % C == 0: a column is all in or all out
      float t = v.x + v.y + v.z + v.w;
#pragma unroll
      for (int o = C / 8; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
      if (in && (threadIdx.x & 31) % (C / 4) == 0) sg.colX[e / C] = t;
    }
  }
  cbar();
}

// Geometry of a GEMV-class tile in its stage: codes [parts][rows][row_b], then (affine) per part a block of
// sc_row bytes of scales, then the same of biases. A part's scale rows are copied from the 16-byte unit that
// holds their first element: they start scale_skip(row0) bytes into the block.
struct TileGeo {
  int R, parts, nin, n;  // rows per tile; parts; 16-byte columns per part row; columns of a virtual row
  int64_t row_b;
  int ng, gs;
  uint32_t codes_b, sc_row;
};
__device__ __forceinline__ TileGeo tile_geo(const OpDesc& op) {
  TileGeo t;
  const int C = op.m.bits == 0 ? 8 : 128 / op.m.bits;
  t.R = op.rows;
  t.parts = op.parts;
  t.nin = op.in / C;
  t.n = op.in_kind == kInConcat ? op.parts * t.nin : t.nin;
  t.row_b = op.m.row_b;
  t.ng = op.m.ng;
  t.gs = op.m.gs;
  t.codes_b = uint32_t(int64_t(op.parts) * op.rows * op.m.row_b);
  t.sc_row = scale_row_bytes(op.rows, op.m.ng);
  return t;
}

// Dot products of this warp's rows of one tile (rows w, w + kCW, ...; row < nv) with the staged input.
// NA accumulators per row: 1 (plain / concat: one virtual row over every part), 2 (SwiGLU: gate, up).
// skip0 / skip1: scale_skip of the first row of part 0 / part 1 (concat: every part's rows start alike).
template <int MODE, int NA, bool CONCAT>
__device__ __forceinline__ void tile_dots(const TileGeo& tg, const uint8_t* st, const float* xs, const float* colX, int nv,
                                          uint32_t skip0, uint32_t skip1, float (&acc)[kMaxRpw][2]) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) - 1;
#pragma unroll
  for (int j = 0; j < kMaxRpw; ++j) acc[j][0] = acc[j][1] = 0.f;
  if constexpr (MODE == 0) {  // bf16: 8 elements per column, the input staged plainly
    for (int i = lane; i < tg.n; i += 32) {
      const float4 x0 = *reinterpret_cast<const float4*>(xs + 8 * i), x1 = *reinterpret_cast<const float4*>(xs + 8 * i + 4);
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      int part = 0, col = i;
      if constexpr (CONCAT) { part = i / tg.nin; col = i - part * tg.nin; }
#pragma unroll
      for (int j = 0; j < kMaxRpw; ++j) {
        const int r = w + kCW * j;
        if (r >= nv) break;
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          const int srow = (CONCAT ? part : a) * tg.R + r;
          float f[8];
          bf8(*reinterpret_cast<const uint4*>(st + srow * tg.row_b + col * 16), f);
          float s = acc[j][a];
#pragma unroll
          for (int k = 0; k < 8; ++k) s = fmaf(f[k], xv[k], s);
          acc[j][a] = s;
        }
      }
    }
  } else {
    constexpr int C = 128 / MODE;
    const uint8_t* sbase = st + tg.codes_b;
    const uint8_t* bbase = st + tg.codes_b + uint32_t(tg.parts) * tg.sc_row;
    for (int i = lane; i < tg.n; i += 32) {
      float xv[C];
      const float4* x4 = reinterpret_cast<const float4*>(xs) + (i >> 5) * 8 * C + (i & 31);
#pragma unroll
      for (int k = 0; k < C / 4; ++k) {
        const float4 v = x4[k * 32];
        xv[4 * k] = v.x; xv[4 * k + 1] = v.y; xv[4 * k + 2] = v.z; xv[4 * k + 3] = v.w;
      }
      const float cx = colX[i], ck = kColScale<MODE> * cx;
      int part = 0, col = i;
      if constexpr (CONCAT) { part = i / tg.nin; col = i - part * tg.nin; }
      const int g = (col * C) / tg.gs;
#pragma unroll
      for (int j = 0; j < kMaxRpw; ++j) {
        const int r = w + kCW * j;
        if (r >= nv) break;
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          const int pp = CONCAT ? part : a;
          const int srow = pp * tg.R + r;
          const uint4 wq = *reinterpret_cast<const uint4*>(st + srow * tg.row_b + col * 16);
          const uint32_t so = uint32_t(pp) * tg.sc_row + (pp == 1 && !CONCAT ? skip1 : skip0) + uint32_t(r * tg.ng + g) * 2u;
          const float sc = bf(*reinterpret_cast<const uint16_t*>(sbase + so)), bi = bf(*reinterpret_cast<const uint16_t*>(bbase + so));
          acc[j][a] = fmaf(sc, col_dot<MODE>(wq, xv) - ck, fmaf(bi, cx, acc[j][a]));
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxRpw; ++j) {
    acc[j][0] = warp_sum(acc[j][0]);
    if (NA == 2) acc[j][1] = warp_sum(acc[j][1]);
  }
}

// Expert slot of tile `tile` of a gate‖up op: the shared expert's tiles first (they need no routing).
__device__ __forceinline__ int gu_slot(const OpDesc& op, int tile, int rtiles) {
  const int s = tile / rtiles;
  return op.shared_slot < 0 ? s : s == 0 ? op.shared_slot : s - 1;
}

// The step's group and a layer's slot row, as the block copied them to shared memory.
__device__ __forceinline__ const DevGroup& group0(const Params&) { return s_group; }
__device__ __forceinline__ const SlotLite& slot_entry(const Params&, int layer) { return s_slot[layer]; }

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

}  // namespace lily::cuda::mk
