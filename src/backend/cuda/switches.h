// Kernel-level switches of the CUDA backend (A/B measurements, debugging), plain C++. The backend sets
// them from CudaOptions (cuda_backend.h) before each step it launches; tests set them directly. The host
// side of the launchers reads them; a captured graph keeps the launches it was captured with.
#pragma once
#include <cstdint>

#include "backend/product_class.h"

namespace lily::cuda {

// Operands of the prompt (many-row) GEMMs; decode products (GEMVs) always take fp32 activations.
//   kBf16:  activations rounded to bf16 once (affine weights dequantised to bf16, EXL3 inputs to fp16): one
//           product per multiply, |error| <= ~2^-8 · Σ|x|·|w| per output, as HF / vLLM / llama.cpp run bf16.
//           The CLI's `--precision bf16`: ~1.4x faster prompts, but short of the fidelity bar (bench/RESULTS.md).
//   kFp16:  each activation row multiplied by a power of two (backend/fp16_scale.h, undone on its outputs) and
//           rounded to fp16, weights (bf16, affine s·q + b, EXL3) in fp16: one product per multiply at the bf16
//           rate, |error| <= ~2^-10 · Σ|x|·|w|. The CLI's `--precision fp16`.
//   kSplit: activations (and affine weights) split into bf16 hi + lo parts, two (three) products per multiply:
//           ~fp32-class results (|error| ~ 2^-17 · Σ|x|·|w|). The CLI's `--precision high`.
// kBf16 and kFp16 apply to the products of the classes in KernelSwitches::reduced_classes; the others split.
enum class GemmPrec { kBf16, kSplit, kFp16 };

constexpr int kWgmmaOff = 0, kWgmmaOn = 1, kWgmmaAuto = 2;  // KernelSwitches::gemm_wgmma

struct KernelSwitches {
  bool pdl = true;              // programmatic dependent launch between decode kernels
  bool gemv_ring = true;        // TMA-fed shared-memory ring for affine decode GEMVs (sm_90)
  // 4-bit products of the streaming GEMV (gemv.cu: the experts per slot from 2 tokens, rows the ring does not take)
  // dequantise codes in place into floats of exponent 2^23 (a LOP3 and an FADD a code), instead of shifts and
  // int->float conversions. Off: on the H100, verify 2-8 rows and streams moved 0 to −1% with it.
  bool gemv_mantissa = false;
  GemmPrec gemm_prec = GemmPrec::kSplit;  // prompt GEMM operands (above)
  // With gemm_prec kBf16 or kFp16: the product classes (backend/product_class.h, Mat::cls) whose prompt GEMMs
  // take those operands; the rest stay split. Default every class but the router (a bf16 rounding of its input
  // flips near-tied experts). The CPU backend emulates a choice (CpuOptions::emulate_bf16 / emulate_fp16).
  uint32_t reduced_classes = kProdAll & ~uint32_t(kProdRouter);
  // bf16 / fp16 prompt GEMMs on the wgmma + TMA kernels (sm_90a) or mma.sync: kWgmmaOff, kWgmmaOn (every product
  // they take), kWgmmaAuto (those measured faster on them, bench/RESULTS.md: bf16 and affine 4-bit weights).
  int gemm_wgmma = kWgmmaAuto;
  bool wgmma_rs = true;         // its affine and fp16-mode products: weights dequantised in registers (off: by
                                // producer warps into shared memory)
  int wgmma_raster = 0;         // its unit order: 0 tile-major (CTAs share rows), 1 column-major (share weights)
  bool gemm_skip_empty = true;  // expert GEMM warps skip the MMAs of row tiles past a partial tile
  bool ring_early_ids = true;   // the MoE down+combine ring product reads its expert ids before its PDL wait
  // Steps of ring_rows_min..4 rows run the ring with several input rows (dense products and expert gate/up read
  // once for all rows, the down + combine of all tokens in one launch; 0: never). 2: on the H100, with the
  // experts per slot (ring_moe_rows 1) 2 rows gained 2-3% against the per-row GEMVs (bench/RESULTS.md).
  int ring_rows_min = 2;
  // MoE steps of up to this many tokens (0..4) take the ring's SwiGLU and down + combine kinds; more tokens
  // take a GEMV per (token, expert) slot and the combine kernel. 1: on the H100 the per-slot GEMVs were
  // 3-4% faster at 3 rows (bench/RESULTS.md, ninth session).
  int ring_moe_rows = 1;
  // Steps of up to this many rows (2..16) RMS-normalise x inside their products (ring, per-slot GEMVs, router,
  // DeltaNet b|a, dense multi-row products, head) instead of an RMSNorm kernel first; their MoE runs per slot.
  // 8 with rows_min 3: on the H100 verify 3 / 4 / 8 rows −9 / −10 / −6%, 4 / 8 streams +13 / +7%; 16 lost
  // 8% at 16 streams (bench/RESULTS.md, ninth session).
  int norm_rows = 8;
  // EXL3 decode GEMVs of few column blocks split k over a cluster of up to 8 blocks while the grid stays within
  // this many blocks per SM (0: never split)
  int exl3_gemv_split = 2;
  // ... as independent blocks (any split up to one k-tile row per warp; the last block of a column block adds
  // the partial sums in rank order and finishes) instead of clusters (at most 8, and only as many as fit at once)
  bool exl3_gemv_fixup = true;
  int exl3_split_rows = 1;      // ... the independent blocks' split leaves each warp at least this many k-tile rows
  int exl3_fixup_min_in = 2048; // ... and takes inputs of at least this many (padded) columns; narrower ones cluster
  bool exl3_pdl = true;         // EXL3 decode GEMVs launched with PDL (with pdl): the first weights load early
  bool exl3_down_combine = false;  // EXL3 MoE decode: the down GEMV adds the weighted slots into the residual itself
  int gemv_rows = 16;           // dense products of up to this many rows run as one GEMV per row, more as GEMMs
  int moe_gemv_rows = 32;       // MoE steps of up to this many rows run one GEMV per (row, expert) slot
  // Multi-row products (gemv_rows.cu), ahead of the two above, for steps of rows_min..N rows (0: off).
  // rows_min 3 with norm_rows 8: the dense products of 3-8 rows with their norm inside (above); rows_min 6
  // was the H200's choice when those steps ran an RMSNorm kernel first (bench/RESULTS.md).
  int rows_dense = 32;          // dense products read each weight once for all rows
  int rows_moe = 32;            // MoE steps grouped per expert (each chosen expert read once)
  int rows_min = 3;             // 3..33; steps of 1-2 rows keep the GEMVs (2 rows on the tensor cores: +12%)
  // ... for EXL3 weights (their norms do not fuse, exl3_rows and the grouped EXL3 experts): 6. On the H100 from 3
  // rows, verify 3 / 4 rows took 9.35 / 9.89 ms against 5.96 / 7.40 and 4 streams 412 against 518 tok/s.
  int rows_min_exl3 = 6;
  // The multi-row kernel's weight chunks in flight per lane (2 or 4 register buffers; 8-bit weights keep 2), and
  // its k split: the fewest warps per row group whose grid reaches rows_waves blocks per SM (8: many small blocks;
  // fewer keeps each warp streaming longer, which a deeper pipeline needs).
  // Depth 4 on the H100: verify 4 rows +1.4%, 16 streams −7%.
  int rows_depth = 2;
  int rows_waves = 8;
  // ... and in steps of up to 8 rows a matrix below that grid at the largest split takes 16 rows a warp, not 32:
  // on the H100 verify 3 / 4 / 8 rows −4.6 / −4.6 / −2.5%, 4 streams +4%.
  bool rows_half = true;
  // The multi-row products' activation rows split into bf16 hi/lo MMA operands (and Σx per chunk, any fused
  // norm applied) once by a staging pass, instead of by every block (each expert tile, each weight tile) per
  // chunk: 0 off, 1 the grouped experts, 2 also the dense products. Same bits either way. 2: on the H100
  // 16 / 32 streams +6%, 4 / 8 streams +2%, verify 4 / 8 rows −2 / −1.4%, one row level (1: 16 streams +4.5%).
  int rows_stage = 2;
  // Attention of a step of 2-4 rows of one sequence whose G·T packed rows exceed the decode kernel's 8 (a
  // verification) runs the decode kernel with a block per kDecRows / G tokens (each reads the keys, from L2 after
  // the first) instead of the prompt kernel's one 64-row tile per KV head: on the H100 verify 2 / 3 rows −2%.
  bool attn_token_blocks = true;
};

// Process-wide: the last values set apply to every launch that follows.
void set_kernel_switches(const KernelSwitches& s);
const KernelSwitches& kernel_switches();

}  // namespace lily::cuda
