#include "cli/backend_options.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_rank.h"
#include "backend/rank_driver.h"
#include "core/error.h"
#ifdef LILY_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/shard_ranks.h"
#endif

namespace lily::cli {

void add_cuda_opt(CLI::App& app, std::vector<std::string>& dst) {
  app.add_option("--cuda-opt", dst,
                 "CUDA backend option name=value, repeatable (graphs, chunk_min, profile, ba_fold, topk_fold, pdl, "
                 "gemv_ring, precision, classes, gemm_wgmma, wgmma_rs, wgmma_raster, gemm_skip_empty, ring_early_ids, exl3_gemv_split, exl3_gemv_fixup, exl3_split_rows, exl3_fixup_min_in, exl3_pdl, exl3_down_combine, shared_in_stack, gemv_rows, moe_gemv_rows, device)");
  app.add_option_function<std::string>(
         "--precision", [&dst](const std::string& v) { dst.push_back("precision=" + v); },
         "CUDA prompt GEMM operands: high (default: split bf16 hi/lo, ~fp32 results), fp16 (one product per "
         "multiply, rows scaled by powers of two: ~8x less rounding than bf16) or bf16 (one product per multiply, "
         "as HF/vLLM run bf16: faster prompts, larger logit differences)")
      ->check(CLI::IsMember({"bf16", "fp16", "high"}));
}

void add_cpu_opt(CLI::App& app, std::vector<std::string>& dst) {
  app.add_option("--cpu-opt", dst,
                 "CPU backend option name=value, repeatable (emulate_bf16=CLASS,... / emulate_fp16=CLASS,...: those "
                 "products with bf16 / fp16 operands, emulating the CUDA prompt GEMMs; emulate_bf16_rows, emulate_split, "
                 "emulate_bf16_kv, emulate_k_order, recurrent_max_rows, affine)");
}

void add_devices_opt(CLI::App& app, std::string& dst) {
  app.add_option("--devices", dst,
                 "Split the model over N ranks (tensor parallel heads, expert ranges, vocabulary-split head): GPUs "
                 "0..N-1 with --backend cuda (NCCL), N CPU ranks in turn with --backend cpu; or a GPU list a,b,... "
                 "(a GPU named twice runs its ranks in turn)");
}

void require_cuda_backend(const std::vector<std::string>& cuda_opts, const std::string& backend) {
  if (!cuda_opts.empty() && backend != "cuda")
    fail("--cuda-opt / --precision need --backend cuda (got --backend {}; the CPU backend computes in float32)", backend);
}

std::unique_ptr<Backend> make_backend_with(std::shared_ptr<const ModelWeights> w, const std::vector<std::string>& cuda_opts,
                                           const std::string& devices) {
#ifdef LILY_HAVE_CUDA
  CudaOptions co;
  for (const std::string& kv : cuda_opts) set_cuda_option(co, kv);
  if (!devices.empty()) return make_cuda_ranks(std::move(w), parse_devices(devices), co);
  return make_cuda_backend(std::move(w), co);
#else
  (void)w;
  (void)cuda_opts;
  (void)devices;
  fail("--cuda-opt: this build has no CUDA backend (configure with nvcc present)");
#endif
}

std::unique_ptr<Engine> engine_from_weights(std::shared_ptr<const ModelWeights> w, const EngineOptions& eo,
                                            const std::vector<std::string>& cuda_opts) {
  if (cuda_opts.empty()) return Engine::from_weights(std::move(w), eo);
  require_cuda_backend(cuda_opts, eo.backend);
  auto be = make_backend_with(w, cuda_opts, eo.devices);
  return Engine::from_backend(std::move(w), std::move(be), eo);
}

std::unique_ptr<Engine> open_engine(const std::string& dir, const EngineOptions& eo, const std::vector<std::string>& cuda_opts,
                                    const std::vector<std::string>& cpu_opts) {
  if (!cpu_opts.empty()) {
    if (eo.backend != "cpu") fail("--cpu-opt needs --backend cpu (got --backend {})", eo.backend);
    if (!cuda_opts.empty()) fail("--cuda-opt / --precision need --backend cuda (got --cpu-opt, which needs --backend cpu)");
    cpu::CpuOptions co;
    for (const std::string& kv : cpu_opts) cpu::set_cpu_option(co, kv);
    auto w = ModelWeights::load(dir);
    auto be = cpu::make_cpu_backend(w, eo.devices, co);
    return Engine::from_backend(std::move(w), std::move(be), eo);
  }
  if (cuda_opts.empty()) return Engine::open(dir, eo);
  require_cuda_backend(cuda_opts, eo.backend);
  return engine_from_weights(ModelWeights::load(dir), eo, cuda_opts);
}

}  // namespace lily::cli
