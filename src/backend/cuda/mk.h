// The decode step as one persistent kernel (mk_kernel.cu): plain C++ types shared by the plan builder
// (mk_plan.cpp), the kernel and the backend.
//
// A step is a list of ops in model order (embed, the projections, the DeltaNet step, attention splits and
// their merge, router + top-k, expert gate‖up, expert down + combine, head + argmax). Each op is cut into
// tiles; each SM (one block per SM) gets a task per op: a contiguous range of that op's tiles. Blocks run
// their tasks in op order. An op waits for its dependencies through counters in global memory (each task
// of an op adds one to the op's counter when its outputs are written), never through a kernel boundary.
// One producer warp per block streams what its tasks read from memory that no op of the step writes
// (weight tiles, the recurrent state, cached keys and values) through a ring of shared-memory stages with
// the Tensor Memory Accelerator, as far ahead as the ring allows and across op boundaries; expert tiles
// wait for the routing. Consumer warps wait for an op's inputs, compute, and free the stages.
//
// Coverage (MkPlan::covers): one-row steps of one sequence, not tentative, not MTP; bf16 and MLX affine
// 4/8-bit weights; other steps take the per-block kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lily::cuda::mk {

enum OpType : int32_t {
  kEmbed = 0,   // x = table row of the token (or of the id fed for the group's slot)
  kGemv,        // y (+)= W · stage(x), tiles of `rows` output rows
  kRouter,      // logits = W · norm(x); the last task runs the top-k and sets the routed counter
  kExpertGu,    // per (slot, row tile): h[slot] = silu(gate_e · x̂) ⊙ (up_e · x̂), e the slot's expert
  kExpertDown,  // x += Σ_slot w_slot · (down_e · h_slot), tiles of output rows over every slot
  kGdn,         // per (value head, row chunk): conv, gates, delta rule; outputs o and Σo² per chunk
  kAttnSplit,   // per (KV head, split): q/k norm, RoPE, KV append, partial attention of its keys
  kAttnMerge,   // per query head: merge the splits, sigmoid gate
  kHead,        // logits = W · norm(x); argmax over every task, the last task writes the id
  kNumOpTypes
};
const char* op_name(int32_t type);

// How a GEMV-class op stages its input vector (once per task, in shared memory).
enum InKind : int32_t {
  kInPlain = 0,  // x
  kInNorm,       // RMSNorm(x) · norm_w
  kInGdnGated,   // gated RMSNorm of the DeltaNet output: o · rsqrt(Σo²_head / dv + eps) · norm_w[d] · silu(z)
  kInConcat,     // [w_0 · h_0 ‖ w_1 · h_1 ‖ ...] over the op's parts (MoE down + combine)
};

constexpr int kMaxDeps = 4;
constexpr int kMaxParts = 32;           // slots of a token (top-k + shared)
constexpr int kMaxStagedInputs = 8192;  // input elements of a GEMV-class op (concat: all parts)
constexpr int kMaxTileRows = 45;        // output rows of a GEMV-class tile (3 per consumer warp)
constexpr int kMaxAttnOutputs = 4096;   // query heads per KV head × head dim

// A weight matrix or expert stack as the kernel streams it: rows of row_b bytes, experts e_b bytes apart.
struct WMat {
  int32_t bits = 0;  // 0: bf16; 4 / 8: MLX affine
  int32_t gs = 0;    // affine group size
  int32_t ng = 0;    // affine groups per row
  const uint8_t* w = nullptr;  // bf16 elements or affine codes
  const uint16_t* s = nullptr;  // affine scales (bf16), [experts][rows][ng]
  const uint16_t* b = nullptr;  // affine biases
  int64_t row_b = 0, e_b = 0;   // bytes per row, bytes between experts
  int64_t e_s = 0;              // scale elements between experts
};

struct GdnArgs {
  int32_t Hk = 0, Hv = 0, dk = 0, dv = 0, K = 0, nck = 1;  // nck: row chunks per value head (tiles Hv·nck)
  const float *convw = nullptr, *dt_bias = nullptr, *A_neg = nullptr;
  const float* proj = nullptr;  // [qkv | z | b | a] of the row
  float* out = nullptr;         // o [Hv·dv] (before the gated norm)
  float* part = nullptr;        // Σo² [Hv][nck]
  int32_t readcnt = -1;         // counters [Hk]: tiles of a key head that read its q/k conv state
};

struct AttnArgs {
  int32_t Hq = 0, Hkv = 0, hd = 0, rot = 0, nsplit = 1, kc = 32;  // tiles Hkv·nsplit; kc keys per stage
  float eps = 1e-6f, theta = 1e4f;  // theta: RoPE base when inv_freq is null
  const float *q_norm = nullptr, *k_norm = nullptr, *inv_freq = nullptr;
  const float* proj = nullptr;  // [q|gate per head, k, v] of the row
  float *po = nullptr, *pm = nullptr, *pl = nullptr;  // partials [Hq][nsplit][hd], [Hq][nsplit] ×2
  float* out = nullptr;         // [Hq·hd]
};

struct RouteArgs {
  int32_t E = 0, k = 0, norm_topk = 1, shared = 0, gated = 0;  // as TopkArgs (kernels.cuh)
  int32_t* idx = nullptr;  // [slots]
  float* w = nullptr;      // [slots]
  int32_t routed = -1;     // counter set to 1 once idx / w are written
};

struct HeadArgs {
  unsigned long long* keys = nullptr;  // one argmax key per task
  int32_t* ids = nullptr;              // the drawn id (null: logits only)
  int32_t feed = 0;                    // also into fed[slot of group 0]
  int32_t index = -1;                  // counter handing out the key slots
};

struct alignas(16) OpDesc {
  int32_t type = 0, layer = -1;  // layer: the slot-table row of state ops
  int32_t ntiles = 0, rows = 0;  // tiles; GEMV class: output rows per tile
  int32_t out = 0, in = 0;       // GEMV class: output rows (SwiGLU: I), input width of one part
  int32_t parts = 1;             // row blocks per tile: 1; 2 (gate, up); slots (down + combine)
  int32_t in_kind = kInPlain, accumulate = 0;
  uint32_t stage_bytes = 0;      // bytes one tile streams (0: no stage)
  WMat m;
  const float* x = nullptr;      // input (see InKind)
  const float* norm_w = nullptr;
  float eps = 1e-6f;
  const float* aux0 = nullptr;   // kInGdnGated: z; kInConcat: the slot weights
  const float* aux1 = nullptr;   // kInGdnGated: Σo² partials
  int32_t gated_dv = 0, gated_nck = 0;
  const int32_t* experts = nullptr;  // expert ops: the slots' expert ids (written by the router)
  int32_t shared_slot = -1;      // expert ops: the slot of the shared expert (expert id = E), -1 none
  int32_t shared_e = 0;
  float* y = nullptr;
  int32_t dep[kMaxDeps] = {-1, -1, -1, -1};
  uint32_t dep_n[kMaxDeps] = {0, 0, 0, 0};
  int32_t done = -1;    // counter: tasks finished
  int32_t ntasks = 0;
  int32_t stage_dep = -1;  // producer: counter that must be >= 1 before this op's expert tiles stream (routing)
  GdnArgs gdn;
  AttnArgs attn;
  RouteArgs route;
  HeadArgs head;
};

struct Task {
  int32_t op = 0, t0 = 0, t1 = 0;  // tiles [t0, t1) of op
};

// Words of the error record the kernel writes when a wait times out (then it traps).
enum ErrWord { kErrCode = 0, kErrOp, kErrBlock, kErrValue, kErrWords };

constexpr int kMaxLayers = 80;  // slot-table rows the kernel keeps in shared memory (layers + MTP)
constexpr int kConsumerWarps = 15;  // per block (mk_ops.cuh), besides the producer warp

// The kernel's view of one step (mk_kernel.cu launches it).
struct StepArgs {
  const int32_t* tokens = nullptr;
  const void* groups = nullptr;  // DevGroup [1]
  const void* slots = nullptr;   // DevSlotLayer table [layers][slot_cap]
  int32_t slot_cap = 0;
  int32_t layers = 0;  // slot-table rows read (<= kMaxLayers)
  int32_t* fed = nullptr;
  uint32_t* host_err = nullptr;  // kErrWords words (mapped host memory): a timed-out wait's record
  // Optional timeline, kTraceWords per task (global task index): %globaltimer (ns) at the consumers' start,
  // their dependencies met, their end, the producer's first and last issue of the task's stages; ns the
  // consumers waited for stages and the producer for free stages during the task.
  unsigned long long* trace = nullptr;
  int32_t skip_dots = 0;  // timing experiment: GEMV-class tiles stream but compute nothing (results garbage)
};
// kTrMid: the task's inputs staged (GEMV class), conv and gates done (DeltaNet), q prepared (attention).
enum TraceWord { kTrStart = 0, kTrDeps, kTrEnd, kTrIssue0, kTrIssue1, kTrStageWait, kTrFreeWait, kTrMid, kTraceWords };

// The ops of one step and their partition into per-block tasks (host side, mk_plan.cpp).
class Plan {
 public:
  // Op builders; each returns the op's index. `deps` are op indices whose tasks must all be done first.
  int add(OpDesc op, std::vector<int> deps);
  // Counters the builder hands out (besides each op's `done`).
  int counter(int n = 1);
  const std::vector<OpDesc>& ops() const { return ops_; }
  std::vector<OpDesc>& ops() { return ops_; }

  // Partitions every op over `blocks` blocks (contiguous tile ranges, starting where the previous op's
  // left off) and resolves the dependency targets. Throws InternalError naming the op when a stage does
  // not fit stage_cap.
  void finalize(int blocks, uint32_t stage_cap);
  bool finalized() const { return !task_begin_.empty(); }
  const std::vector<Task>& tasks() const { return tasks_; }
  const std::vector<int32_t>& task_begin() const { return task_begin_; }
  int counters() const { return n_counters_ + 1; }  // the last one: blocks that finished (resets the rest)
  uint32_t stage_bytes() const { return stage_bytes_; }
  size_t staging_floats() const { return staging_floats_; }
  // One line per op: index, type, layer, tiles, tasks, stage bytes, dependencies, dependency level.
  std::vector<std::string> describe() const;
  const std::vector<int>& deps(int op) const { return deps_[size_t(op)]; }
  // A step's timeline (StepArgs::trace, kTraceWords per task) as a report: the kernel's span, per op type the
  // time from its inputs' completion to its first task's start (latency) and from there to its last task's end
  // (work), and per layer the time of its ops.
  std::vector<std::string> trace_report(const std::vector<unsigned long long>& trace) const;
  // The same timeline raw: one CSV line per task (block, op, type, layer, tiles, then each word in ns from the
  // kernel's first start).
  std::string trace_csv(const std::vector<unsigned long long>& trace) const;

 private:
  std::vector<OpDesc> ops_;
  std::vector<std::vector<int>> deps_;
  std::vector<Task> tasks_;
  std::vector<int32_t> task_begin_;
  int n_counters_ = 0;
  uint32_t stage_bytes_ = 0;
  size_t staging_floats_ = 0;
};

#ifdef __CUDACC__
#define LILY_MK_HD __host__ __device__
#else
#define LILY_MK_HD
#endif
// Bytes of one part's affine scales (or biases) in a GEMV-class stage of `rows` rows: its rows' bf16 values
// copied from the 16-byte unit holding the first one, scale_skip(first row) bytes in.
LILY_MK_HD inline uint32_t scale_row_bytes(int rows, int ng) {
  return (uint32_t(rows) * uint32_t(ng) * 2u + 15u) / 16u * 16u + 16u;
}
LILY_MK_HD inline uint32_t scale_skip(int64_t row0, int ng) { return uint32_t((row0 * ng * 2) & 15); }

// Shared-memory floats a GEMV-class op's consumers stage for an input of nel elements (mk_ops.cuh, Staged).
LILY_MK_HD inline size_t staged_floats(int bits, int nel) {
  const int C = bits == 0 ? 8 : 128 / bits;
  const int ncol = nel / C;
  return size_t((ncol + 31) / 32 * 32 * C + ncol);
}

// Shared-memory floats an op's consumers stage (its input vector and column sums, or its scratch).
size_t staging_floats(const OpDesc& op);
// Output rows per tile for a GEMV-class op whose one row (all parts) streams row_bytes, within stage_cap.
int tile_rows(int64_t row_bytes, uint32_t stage_cap, int max_rows);

}  // namespace lily::cuda::mk
