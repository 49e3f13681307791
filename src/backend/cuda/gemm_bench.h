// `lily bench --gemm` (gemm_bench.cu; plain C++ header): the prompt GEMMs alone — the expert products of a
// prompt of `prompt_tokens` tokens at the Qwen3.5-35B-A3B shape (uniform top-8 routing over 256 experts) and
// a dense 8192³ bf16 product for the card's rate — on each kernel (mma.sync in each precision: bf16, fp16 with
// scaled rows, split; wgmma on Hopper unless ks.gemm_wgmma is off), `repeats` timed calls each, under the kernel switches
// `ks` (the wgmma kernel's unit order, for one).
#pragma once
#include <string>
#include <vector>

#include "backend/cuda/switches.h"

namespace lily {

struct CudaGemmBenchRow {
  std::string shape, weights, kernel;
  double ms = 0, tflops = 0;
};
std::vector<CudaGemmBenchRow> cuda_gemm_bench(int prompt_tokens = 4096, int repeats = 10,
                                              const cuda::KernelSwitches& ks = {});

}  // namespace lily
