// Device-level operations of the CUDA backend, callable from plain C++ (tests, cuda_backend.cu).
// All pointers are device pointers unless named host_*; every call is asynchronous on `s`.
// Activations and the residual stream are float32; dense weights are bf16 row-major [out, in].
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/step_desc.h"
#include "backend/product_class.h"

namespace lily::cuda {

// Throws lily::InternalError naming the CUDA error and the call site when e != cudaSuccess.
void check(cudaError_t e, const char* file, int line);
#define LILY_CU(x) ::lily::cuda::check((x), __FILE__, __LINE__)
// Throws lily::InternalError(what) (kernels' host code is compiled without fmt).
[[noreturn]] void fail_internal(const char* what);

// Raises the shared-memory limits of the kernels that need more than 48 KiB (once per device, before
// any capture).
void init_kernels();

// ---- weights ---------------------------------------------------------------------------------
// One weight matrix [out, in] on the device, or E of them stacked (expert e at the given strides).
//   bf16:   rows `ld` elements apart, expert e at w + e·estride.
//   affine: MLX affine (bits 4 or 8, group gs, bf16 scales/biases), read packed: row r is
//           q + r·row_words (uint32 words, codes little-endian in the row's bit stream), its group g
//           scale s[r·(in/gs) + g] and bias b[...]; expert e at q + e·qstride, s/b + e·sstride.
//   exl3:   EXL3 trellis (see Exl3Part): parts[e·nparts + p] (device array) is part p of expert e; the
//           matrix rows are the parts' logical outputs in order. All parts share K, codebook and in_p;
//           the experts of a stack have the same part shapes. Host copies: col_blocks = Σ_p out_p/128 over
//           one expert's parts, in_p.
// One EXL3 Linear on the device (quant/exl3/exl3.h): trellis [in_p/16][out_p/16][16K] uint16, suh fp16
// [in_p], svh fp16 [out_p], bias fp16 [out_p] or null; its logical output j (0 <= j < rows) is padded
// column out_rows[j] (null: j) and matrix row row0 + j.
struct Exl3Part {
  const uint16_t* trellis = nullptr;
  const uint16_t* suh = nullptr;
  const uint16_t* svh = nullptr;
  const uint16_t* bias = nullptr;
  const int32_t* out_rows = nullptr;
  int in_p = 0, out_p = 0, rows = 0, row0 = 0;
};
struct Mat {
  bool affine = false;
  bool exl3 = false;
  const Exl3Part* parts = nullptr;
  int nparts = 0, K = 0, cb = 0, col_blocks = 0, in_p = 0;
  const uint16_t* w = nullptr;
  int64_t ld = 0, estride = 0;
  const uint32_t* q = nullptr;
  const uint16_t* s = nullptr;
  const uint16_t* b = nullptr;
  int bits = 0, gs = 0;
  int64_t row_words = 0, qstride = 0, sstride = 0;
  uint32_t cls = kProdAll;  // product class (backend/product_class.h): picks the prompt GEMM precision
  static Mat bf16(const uint16_t* w, int64_t ld, int64_t estride = 0) {
    Mat m;
    m.w = w; m.ld = ld; m.estride = estride;
    return m;
  }
};

// EXL3 tile decode: W_hat [in_p, out_p] (k-major, fp16 bits) of a whole trellis (tests; bit-exact).
void exl3_decode_tiles(const uint16_t* trellis, int K, int cb, int in_p, int out_p, uint16_t* w_hat, cudaStream_t s);

// ---- linear algebra -------------------------------------------------------------------------
// y[t, 0:out] (= or +=) x[t, 0:in] · Wᵀ for t < T.
// Decode-sized T runs the multi-row product (rows.h) or the row-parallel GEMVs (16-byte weight loads,
// dequantisation in registers), larger T the tiled GEMM (dequantisation while staging the tile).
// norm_w (T <= norm_fuse_rows() only): x rows are RMS-normalised (· norm_w, eps) inside the GEMV.
constexpr int kGemvMaxRows = 2;
// Rows up to which a step's norms fuse into its products: KernelSwitches::norm_rows, at least kGemvMaxRows, at
// most kNormRowsMax and the GEMV row limits (gemv_rows, moe_gemv_rows).
constexpr int kNormRowsMax = 16;
int norm_fuse_rows();
// Steps of at most this many tokens fold the MoE top-k into the router GEMV (MoeDev::topk_counter).
constexpr int kTopkFoldRows = 4;
void linear(const Mat& W, int out, int in, const float* x, int64_t ldx, int T, float* y, int64_t ldy, bool accumulate,
            cudaStream_t s, const float* norm_w = nullptr, float eps = 1e-6f);
inline void linear(const uint16_t* W, int64_t ldw, int out, int in, const float* x, int64_t ldx, int T, float* y,
                   int64_t ldy, bool accumulate, cudaStream_t s) {
  linear(Mat::bf16(W, ldw), out, in, x, ldx, T, y, ldy, accumulate, s);
}

// Device scratch of the split EXL3 decode GEMVs (KernelSwitches::exl3_gemv_fixup) launched on stream s: the
// partial sums and per-column-block counters of one launch at a time, held per stream (counted) until released.
// A split GEMV on a stream without it runs over thread-block clusters. Acquire outside graph capture.
void exl3_split_scratch_acquire(cudaStream_t s);
void exl3_split_scratch_release(cudaStream_t s);
// How exl3_gemv_slots splits k for these operands on stream s: ranks (1: no split) and whether they run as
// independent blocks (else as a cluster).
struct Exl3GemvSplit {
  int ks = 1;
  bool fixup = false;
};
Exl3GemvSplit exl3_gemv_split_of(const Mat& W, int slots, bool swiglu, cudaStream_t s);
// MoE down projection and combine in one launch (KernelSwitches::exl3_down_combine): for T tokens of kk slots
// (slot s: expert expert[s], input row h + s·ldh), x[t, r] += Σ_j weights[t·kk + j] · (W_{expert[t·kk+j]} h)[r],
// bit-identical to exl3_gemv_slots into a buffer then combine_kernel. Uses the stream's split scratch; returns
// false, launching nothing, when W is not a one-part EXL3 stack, the GEMV would split k, or the scratch is
// missing or too small.
bool exl3_gemv_combine(const Mat& W, const int32_t* expert, int out, int in, const float* h, int64_t ldh,
                       const float* weights, int kk, int T, float* x, int64_t ldx, cudaStream_t s);

// Row-parallel GEMV over `slots`: slot s reads expert expert[s] of W (expert null: W itself), input row
// x + (s / xdiv)·ldx and writes y + s·ldy. swiglu_I > 0: W holds gate rows [0, I) and up rows [I, 2I);
// y[r] = silu(gate_r · x) · (up_r · x) for r < I (out is ignored).
// norm_w: input rows RMS-normalised (· norm_w, eps) while staged (fused RMSNorm).
void gemv_slots(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv, int slots,
                float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w = nullptr,
                float eps = 1e-6f);

// Decode GEMV with a TMA-fed shared-memory weight ring (gemv_ring.cu): MLX-affine 4/8-bit, sm_90, at most
// kGemvRingMaxRows input rows. Plain products (expert == nullptr, xdiv 1: `slots` input rows, each weight tile
// read once for all of them) or SwiGLU expert slots (expert ids, swiglu_I > 0, outputs y[s·ldy + r]); same
// meaning as gemv_slots otherwise. Returns false, launching nothing, when the shape, alignment or device is
// not covered (gemv_slots then takes the streaming GEMV).
constexpr int kGemvRingMaxRows = 4;
bool gemv_ring(const Mat& W, const int32_t* expert, int out, int in, const float* x, int64_t ldx, int xdiv, int slots,
               float* y, int64_t ldy, bool accumulate, int swiglu_I, cudaStream_t s, const float* norm_w, float eps);
// MoE down projection and combine in one product, per token g of `groups` (slots / groups consecutive slots
// each): y[g·ldy + r] (+)= Σ_{s of g} weights[s] · (W_{expert[s]}[r, :] · h[s·ldh, :]).
// ids_ready: the previous kernel on s is the ring's SwiGLU product over the same expert ids (it lets its
// dependents start only after its own wait), so the ids may be read, and the weights requested, before this
// kernel's programmatic-launch wait.
bool gemv_ring_concat(const Mat& W, const int32_t* expert, int out, int in, const float* h, int64_t ldh,
                      const float* weights, int slots, int groups, float* y, int64_t ldy, bool accumulate, cudaStream_t s,
                      bool ids_ready = false);
// The ring's plan for a product (host only; tests and tools): kind 0 plain rows, 1 SwiGLU expert slots, 2 MoE
// down projection + combine; rows: output rows, or I for SwiGLU. covered == false: gemv_ring declines it
// whatever the pointers (it may also decline for unaligned pointers or strides).
struct GemvRingPlan {
  bool covered = false;
  int rows_per_tile = 0, stages = 0, tiles = 0, blocks = 0;
  size_t smem = 0;
};
GemvRingPlan gemv_ring_plan(int kind, int bits, int gs, int in, int rows, int slots, int sm_count, int nx = 1,
                            int groups = 1);
// The ring is on for gemv_slots unless KernelSwitches::gemv_ring is off (switches.h).

// Launch shape of the decode GEMV for `mode` (0 bf16, else affine bits), reported for tests and tools:
// RPW rows per warp streamed together, LPR lanes per row, KS warps splitting the reduction dimension,
// `tiles` row tiles per slot, walked by `blocks` blocks per slot (grid-stride).
struct GemvShape {
  int rpw = 1, lpr = 32, ks = 1, tiles = 1, blocks = 1;
};
GemvShape gemv_shape(int mode, int in, int nrows, int slots, int sm_count, bool swiglu);

// Tiled GEMM. Tile i covers rows [row0, row0 + nrows) (at most 64, below T) of expert e, from
// tiles[3i .. 3i+2] = {e, row0, nrows}; *n_tiles (device) of max_tiles are live. tiles == null: dense,
// tile i = rows [64 i, min(64 i + 64, T)). Row r of the product reads x row gather[r] (null: r) and
// writes y row r. x_rows > 0: x has that many rows (every row a gather names is below it), so that the fp16
// mode scales each x row once; 0: it scales the rows the product reads, once per product row.
void gemm_tiles(const Mat& W, int out, int in, const float* x, int64_t ldx, const int32_t* gather, float* y, int64_t ldy,
                bool accumulate, const int32_t* tiles, const int32_t* n_tiles, int max_tiles, int T, cudaStream_t s,
                int x_rows = 0);

// x[t, :] = RMSNorm(x_in[t, :]) · w  (w already folded to (1 + w) where the model says so).
void rmsnorm(const float* x, int64_t ldx, const float* w, int T, int H, float eps, float* y, int64_t ldy,
             cudaStream_t s);
// x[t, :] = row tokens[t] of the table (dequantised), H columns. A negative token (kFedToken) reads
// fed[groups[row_group[t]].slot] instead (the id the device drew for that sequence last); fed == null:
// every token is an id.
void embed(const Mat& table, int H, const int32_t* tokens, int T, float* x, cudaStream_t s,
           const int32_t* row_group = nullptr, const DevGroup* groups = nullptr, const int32_t* fed = nullptr);
inline void embed(const uint16_t* table, int64_t ld, int H, const int32_t* tokens, int T, float* x, cudaStream_t s) {
  embed(Mat::bf16(table, ld), H, tokens, T, x, s);
}
// out[r] = argmax_v logits[row(r), v] (lowest index on ties; NaN never wins) with row(r) = row_index[r]
// (null: r); where fed_slot[r] >= 0 (fed_slot and fed non-null) the id also goes to fed[fed_slot[r]].
// scratch: argmax_scratch_bytes(rows) of device memory, zero before the first call; every call leaves
// it zero again.
size_t argmax_scratch_bytes(int rows);
void argmax(const float* logits, int rows, int V, int32_t* out, void* scratch, cudaStream_t s,
            const int32_t* row_index = nullptr, const int32_t* fed_slot = nullptr, int32_t* fed = nullptr);
// *pos += T.
void advance_pos(int64_t* pos, int T, cudaStream_t s);
// y[r, c] = v for rows r < rows and columns c0 <= c < c1 (row stride ld).
void fill_cols(float* y, int64_t ld, int rows, int c0, int c1, float v, cudaStream_t s);
// y[i, :] = x[rows[i], :] for i < n (H floats per row; rows on the device).
void gather_rows(const float* x, int64_t ldx, const int32_t* rows, int n, int H, float* y, int64_t ldy, cudaStream_t s);

// ---- MoE (or the dense MLP when moe == false) ----------------------------------------------
struct MoeDev {
  bool moe = true;
  int E = 0, k = 0, I = 0, Is = 0, H = 0;
  bool norm_topk = true;
  Mat router;      // [E, H]
  Mat gate_up;     // E × [2I, H]: rows [0, I) gate, [I, 2I) up, per expert
  Mat down;        // E × [H, I]
  Mat sh_gate_up;  // [2Is, H] shared expert (or the dense MLP); absent when Is == 0
  Mat sh_down;     // [H, Is]
  Mat sh_gate;     // [1, H] sigmoid gate of the shared expert; absent (no pointer): weight 1
  bool gate_in_router = false;  // router holds E + 1 rows, the last one the shared-expert gate
  // The shared expert rides in the routed stacks as expert E (gate_up / down hold E + 1 experts): every
  // token then has k + 1 slots, the last one expert E weighted by sigmoid(router row E) (gate_in_router)
  // or 1 (no gate). Needs Is == I and the experts' formats; sh_* are then unused.
  bool shared_in_stack = false;
  // A zeroed device word (shareable by every layer of a stream): steps of 1..kTopkFoldRows (4) tokens then fold
  // the top-k into the router GEMV (the last block runs it). Null: a separate top-k kernel.
  unsigned* topk_counter = nullptr;
  // Dense MLP (moe == false): a device int32 0, the expert id of the matrix itself, so that one-token
  // affine steps take the expert GEMV path (the ring's SwiGLU product). Null: the plain GEMV.
  const int32_t* zero_id = nullptr;
  int slots_per_token() const { return k + (shared_in_stack ? 1 : 0); }
};
size_t moe_scratch_bytes(const MoeDev& m, int T);
// x[t] += MoE(u[t]) for t < T. Routing stays on the device (no host synchronisation).
// side/fork/join: optional second stream and two events; the shared expert then runs on `side`
// concurrently with the router and routed experts (also inside a graph capture).
// u == null (T <= norm_fuse_rows()): the block normalises x itself with norm_w / eps inside its GEMVs.
void moe(const MoeDev& m, const float* u, int T, float* x, void* scratch, cudaStream_t s, cudaStream_t side = nullptr,
         cudaEvent_t fork = nullptr, cudaEvent_t join = nullptr, const float* norm_w = nullptr, float eps = 1e-6f);

}  // namespace lily::cuda
