// Tiny synthetic models (MoE, and the dense Qwen3.5 with tied embeddings) in bf16 and MLX affine 4 / 8-bit
// (EXL3: test_cuda_exl3.cpp): the CUDA backend
// against the CPU backend on the same in-memory weights — teacher-forced top-1, perplexity within 0.05%,
// 64 greedy tokens identical (cuda_compare.h).
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaSynth, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <string>

#include "cuda_compare.h"
#include "cuda_test_util.h"
#include "tools/synth.h"

namespace {
using namespace lily;

TEST(CudaSynth, TinyModelMatchesCpuEveryFormat) {
  LILY_REQUIRE_GPU();
  for (const char* preset : {"tiny", "tiny-dense"})
  for (auto f : {SynthFormat::BF16, SynthFormat::Affine4, SynthFormat::Affine8}) {
    SynthOptions so;
    so.preset = preset;
    so.format = f;
    so.seed = 7;
    auto w = synth_model(so);
    std::vector<int32_t> prompt(160);  // enough rows that one near-tie (allowed) keeps strict top-1 >= 99%
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(w->cfg.vocab));
    // the CUDA affine kernels take float activations: the CPU reference is its exact path, not int8
    cpu::CpuOptions copt;
    copt.affine = cpu::AffinePath::Exact;
    const std::string what = std::string(preset) + " synth " + synth_format_name(f);
    cudatest::compare_backends(w, prompt, what.c_str(), copt, 64);
  }
}

}  // namespace
#endif
