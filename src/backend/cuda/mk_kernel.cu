// The decode step as one persistent kernel (mk.h): producer, the GEMV-class consumers, the task loop and
// the launcher (the DeltaNet and attention consumers are in mk_gdn.cuh and mk_attn.cuh).
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/device_info.h"
#include "backend/cuda/mk_launch.h"
#include "backend/cuda/mk_attn.cuh"
#include "backend/cuda/mk_gdn.cuh"
#include "backend/cuda/mk_ops.cuh"

namespace lily::cuda::mk {
namespace {

// The op of a task into shared memory: lane i of the calling warp(s) copies 16 bytes.
__device__ __forceinline__ void copy_op(const OpDesc* src, OpDesc* dst, int i) {
  if (i < kOpWords) reinterpret_cast<uint4*>(dst)[i] = __ldg(reinterpret_cast<const uint4*>(src) + i);
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
