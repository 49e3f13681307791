// CudaOptions by name (the CLI's repeated --cuda-opt name=value, tests, tools): one table of names.
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/product_class.h"
#include "core/error.h"
#include "core/named_options.h"

namespace lily {
namespace {

using Field = NamedField<CudaOptions>;

bool parse_bool(const std::string& name, const std::string& v) {
  if (v == "1" || v == "on" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "off" || v == "false" || v == "no") return false;
  fail("--cuda-opt {}={}: expected 1/0, on/off or true/false", name, v);
}

int parse_int(const std::string& name, const std::string& v) {
  try {
    size_t used = 0;
    const int x = std::stoi(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  fail("--cuda-opt {}={}: expected an integer", name, v);
}

int parse_int_in(const std::string& name, const std::string& v, int lo, int hi) {
  const int x = parse_int(name, v);
  if (x < lo || x > hi) fail("--cuda-opt {}={}: must be in {}..{}", name, v, lo, hi);
  return x;
}

// A power of two in lo..hi (pipeline depths, split counts).
int parse_pow2_in(const std::string& name, const std::string& v, int lo, int hi) {
  const int x = parse_int_in(name, v, lo, hi);
  if ((x & (x - 1)) != 0) fail("--cuda-opt {}={}: must be a power of two in {}..{}", name, v, lo, hi);
  return x;
}

cuda::GemmPrec parse_precision(const std::string& v) {
  if (v == "bf16") return cuda::GemmPrec::kBf16;
  if (v == "fp16") return cuda::GemmPrec::kFp16;
  if (v == "high") return cuda::GemmPrec::kSplit;
  fail("--cuda-opt precision={}: expected fp16, bf16 or high", v);
}

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"device", "CUDA device ordinal", [](CudaOptions& o, const std::string& v) { o.device = parse_int("device", v); }},
      {"graphs", "capture decode steps as CUDA graphs", [](CudaOptions& o, const std::string& v) { o.graphs = parse_bool("graphs", v); }},
      {"chunk_min", "DeltaNet: rows from which a group takes the chunked rule",
       [](CudaOptions& o, const std::string& v) { o.chunk_min = parse_int("chunk_min", v); }},
      {"profile", "time every block (synchronises; no graphs)",
       [](CudaOptions& o, const std::string& v) { o.profile = parse_bool("profile", v); }},
      {"ba_fold", "DeltaNet b|a projection inside the step kernel", [](CudaOptions& o, const std::string& v) { o.ba_fold = parse_bool("ba_fold", v); }},
      {"topk_fold", "MoE top-k inside the router GEMV", [](CudaOptions& o, const std::string& v) { o.topk_fold = parse_bool("topk_fold", v); }},
      {"shared_in_stack", "the shared expert rides in the routed expert stacks as one more slot where its format "
                          "matches theirs (read at weight upload; default on)",
       [](CudaOptions& o, const std::string& v) { o.shared_in_stack = parse_bool("shared_in_stack", v); }},
      {"mk", "one-row decode steps as one persistent kernel (where the model's shapes and formats are covered)",
       [](CudaOptions& o, const std::string& v) { o.mk = parse_bool("mk", v); }},
      {"mk_trace", "the step kernel records a timeline of its tasks (lily bench prints its breakdown)",
       [](CudaOptions& o, const std::string& v) { o.mk_trace = parse_bool("mk_trace", v); }},
      {"mk_skip_dots", "timing experiment: the step kernel skips the dot products of its weight tiles (wrong results)",
       [](CudaOptions& o, const std::string& v) { o.mk_skip_dots = parse_bool("mk_skip_dots", v); }},
      {"mk_stage_kb", "the step kernel's ring stage (its largest weight tile), KiB (32..100)",
       [](CudaOptions& o, const std::string& v) { o.mk_stage_kb = parse_int_in("mk_stage_kb", v, 32, 100); }},
      {"mk_trace_csv", "with mk_trace=1: a file for the raw timeline (CSV, one line per task) of the latest step",
       [](CudaOptions& o, const std::string& v) { o.mk_trace_csv = v; }},
      {"pdl", "programmatic dependent launch", [](CudaOptions& o, const std::string& v) { o.kernels.pdl = parse_bool("pdl", v); }},
      {"gemv_ring", "TMA ring GEMV for affine decode products",
       [](CudaOptions& o, const std::string& v) { o.kernels.gemv_ring = parse_bool("gemv_ring", v); }},
      {"precision", "prompt GEMM operands: high (split bf16 hi/lo), fp16 (scaled rows) or bf16 (one product per multiply)",
       [](CudaOptions& o, const std::string& v) { o.kernels.gemm_prec = parse_precision(v); }},
      {"classes", "with precision=fp16 or bf16: the product classes taking it, comma separated (default gpu_bf16: all but router)",
       [](CudaOptions& o, const std::string& v) { o.kernels.reduced_classes = parse_product_classes(v, "--cuda-opt classes"); }},
      {"bf16_classes", "the same as classes",
       [](CudaOptions& o, const std::string& v) { o.kernels.reduced_classes = parse_product_classes(v, "--cuda-opt bf16_classes"); }},
      {"gemm_wgmma", "bf16 / fp16 prompt GEMMs on the Hopper wgmma + TMA kernels: 1 every product they take, 0 none "
                     "(the mma.sync kernel), auto (default) those measured faster on them (bf16 and affine 4-bit weights)",
       [](CudaOptions& o, const std::string& v) {
         o.kernels.gemm_wgmma = v == "auto" ? cuda::kWgmmaAuto : parse_bool("gemm_wgmma", v) ? cuda::kWgmmaOn : cuda::kWgmmaOff;
       }},
      {"wgmma_rs", "the wgmma kernel's affine and fp16-mode products dequantise in registers (default on; off: in shared memory)",
       [](CudaOptions& o, const std::string& v) { o.kernels.wgmma_rs = parse_bool("wgmma_rs", v); }},
      {"wgmma_raster", "the wgmma kernel's unit order: 0 tile-major (default), 1 column-major",
       [](CudaOptions& o, const std::string& v) { o.kernels.wgmma_raster = parse_int_in("wgmma_raster", v, 0, 1); }},
      {"gemm_skip_empty", "expert GEMMs skip empty row tiles",
       [](CudaOptions& o, const std::string& v) { o.kernels.gemm_skip_empty = parse_bool("gemm_skip_empty", v); }},
      {"ring_early_ids", "MoE down product reads expert ids before its PDL wait",
       [](CudaOptions& o, const std::string& v) { o.kernels.ring_early_ids = parse_bool("ring_early_ids", v); }},
      {"exl3_gemv_split", "EXL3 decode GEMVs of few column blocks split k over a thread-block cluster while the grid "
                          "stays within N blocks per SM (sm_90; 0 off; 0..4, default 2)",
       [](CudaOptions& o, const std::string& v) { o.kernels.exl3_gemv_split = parse_int_in("exl3_gemv_split", v, 0, 4); }},
      {"exl3_gemv_fixup", "the split EXL3 decode GEMVs: independent blocks whose last one adds the partial sums in "
                          "rank order (default on; off: thread-block clusters)",
       [](CudaOptions& o, const std::string& v) { o.kernels.exl3_gemv_fixup = parse_bool("exl3_gemv_fixup", v); }},
      {"exl3_split_rows", "with exl3_gemv_fixup: the split leaves each warp at least this many k-tile rows (1..4)",
       [](CudaOptions& o, const std::string& v) { o.kernels.exl3_split_rows = parse_int_in("exl3_split_rows", v, 1, 4); }},
      {"exl3_fixup_min_in", "with exl3_gemv_fixup: only inputs of at least this many columns split over independent "
                            "blocks, narrower ones over clusters (0..65536, default 2048)",
       [](CudaOptions& o, const std::string& v) { o.kernels.exl3_fixup_min_in = parse_int_in("exl3_fixup_min_in", v, 0, 65536); }},
      {"exl3_pdl", "EXL3 decode GEMVs launched with programmatic dependent launch (with pdl; default on)",
       [](CudaOptions& o, const std::string& v) { o.kernels.exl3_pdl = parse_bool("exl3_pdl", v); }},
      {"exl3_down_combine", "EXL3 MoE decode steps: the down GEMV's last block per column block adds the weighted expert "
                            "outputs into the residual (no combine kernel; default off: 0.4% slower on an H200)",
       [](CudaOptions& o, const std::string& v) { o.kernels.exl3_down_combine = parse_bool("exl3_down_combine", v); }},
      {"gemv_rows", "dense products of up to this many rows as GEMVs (2..64)",
       [](CudaOptions& o, const std::string& v) { o.kernels.gemv_rows = parse_int_in("gemv_rows", v, 2, 64); }},
      {"moe_gemv_rows", "MoE steps of up to this many rows as per-slot GEMVs (1..64)",
       [](CudaOptions& o, const std::string& v) { o.kernels.moe_gemv_rows = parse_int_in("moe_gemv_rows", v, 1, 64); }},
      {"rows_dense", "dense products of rows_min..N rows read each weight once for all rows (0: off; 0..32)",
       [](CudaOptions& o, const std::string& v) { o.kernels.rows_dense = parse_int_in("rows_dense", v, 0, 32); }},
      {"rows_moe", "MoE steps of rows_min..N rows grouped per expert (0: off; 0..64)",
       [](CudaOptions& o, const std::string& v) { o.kernels.rows_moe = parse_int_in("rows_moe", v, 0, 64); }},
      {"ring_rows_min", "steps of this many to 4 rows run the ring GEMV with several input rows (0: never; 0..4)",
       [](CudaOptions& o, const std::string& v) { o.kernels.ring_rows_min = parse_int_in("ring_rows_min", v, 0, 4); }},
      {"gemv_mantissa", "4-bit streaming GEMVs (experts per slot) dequantise codes in place into floats of exponent 2^23, "
                        "not by shifts and int->float conversions (default off)",
       [](CudaOptions& o, const std::string& v) { o.kernels.gemv_mantissa = parse_bool("gemv_mantissa", v); }},
      {"ring_moe_rows", "MoE steps of up to this many tokens take the ring's SwiGLU and down + combine (0..4; more: a "
                        "GEMV per slot)",
       [](CudaOptions& o, const std::string& v) { o.kernels.ring_moe_rows = parse_int_in("ring_moe_rows", v, 0, 4); }},
      {"norm_rows", "steps of up to this many rows normalise x inside their products, not in an RMSNorm kernel; their "
                    "MoE runs per slot (2..16)",
       [](CudaOptions& o, const std::string& v) { o.kernels.norm_rows = parse_int_in("norm_rows", v, 2, 16); }},
      {"rows_min_exl3", "the multi-row products of EXL3 weights take steps of at least this many rows (3..33, default 6)",
       [](CudaOptions& o, const std::string& v) { o.kernels.rows_min_exl3 = parse_int_in("rows_min_exl3", v, 3, 33); }},
      {"rows_depth", "weight chunks in flight per lane in the multi-row products (2 or 4, default 2)",
       [](CudaOptions& o, const std::string& v) { o.kernels.rows_depth = parse_pow2_in("rows_depth", v, 2, 4); }},
      {"rows_waves", "the multi-row products split k until their grid reaches this many blocks per SM (1..16, default 8)",
       [](CudaOptions& o, const std::string& v) { o.kernels.rows_waves = parse_int_in("rows_waves", v, 1, 16); }},
      {"rows_half", "multi-row products of up to 8 rows too small for rows_waves at every k split take 16 rows a warp (default on)",
       [](CudaOptions& o, const std::string& v) { o.kernels.rows_half = parse_bool("rows_half", v); }},
      {"rows_stage", "the multi-row products' activation rows split into their bf16 hi/lo operands once by a staging "
                     "pass: 0 off, 1 the grouped experts, 2 also the dense products (default 2)",
       [](CudaOptions& o, const std::string& v) { o.kernels.rows_stage = parse_int_in("rows_stage", v, 0, 2); }},
      {"attn_token_blocks", "attention of 2-4 rows of one sequence beyond the decode kernel's 8 packed rows runs it per "
                            "token block, not the prompt kernel (default on)",
       [](CudaOptions& o, const std::string& v) { o.kernels.attn_token_blocks = parse_bool("attn_token_blocks", v); }},
      {"rows_min", "the multi-row products take steps of at least this many rows (3..33, default 3)",
       [](CudaOptions& o, const std::string& v) { o.kernels.rows_min = parse_int_in("rows_min", v, 3, 33); }},
  };
  return f;
}

}  // namespace

void set_cuda_option(CudaOptions& o, const std::string& name, const std::string& value) {
  set_named_option(fields(), o, "--cuda-opt", name, value);
}

void set_cuda_option(CudaOptions& o, const std::string& name_eq_value) {
  set_named_option(fields(), o, "--cuda-opt", name_eq_value);
}

std::vector<std::string> cuda_option_names() { return named_option_help(fields()); }

}  // namespace lily
