// Whole-model agreement of the CUDA backend with the CPU backend on the same weights (the bar:
// teacher-forced top-1, perplexity, greedy continuation), shared by the model-level CUDA tests.
#pragma once
#ifdef LILY_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/qwen_hybrid.h"
#include "model/weights.h"

namespace lily::cudatest {

inline int64_t argmax_row(const float* p, int64_t n) { return std::max_element(p, p + n) - p; }

// Strict top-1 agreement, top-1 agreement up to near-ties (the CPU logit of the CUDA pick within
// 1e-2 · max(1, logit RMS) of the CPU maximum, the scale of the other backend-level differences such as
// the bf16 KV cache), max |Δlogit| over all rows and over all but the worst 1% of rows (at least one row
// left out: a router logit tie within rounding sends a row to another expert, a discrete change of that
// row alone), and the CPU logit RMS.
struct Agreement {
  double top1 = 0, top1_ties = 0, max_abs = 0, max_abs_99 = 0, rms = 0, worst_gap = 0;
  int strict = 0, ties = 0;
};
inline Agreement agreement(const float* gpu, const float* cpu, int64_t rows, int64_t V) {
  Agreement a;
  double ss = 0;
  for (int64_t i = 0; i < rows * V; ++i) ss += double(cpu[i]) * cpu[i];
  a.rms = std::sqrt(ss / double(rows * V));
  const double tie = 1e-2 * std::max(1.0, a.rms);
  std::vector<double> row_max(static_cast<size_t>(rows), 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    const float* c = cpu + t * V;
    const float* g = gpu + t * V;
    const int64_t ic = argmax_row(c, V), ig = argmax_row(g, V);
    const double gap = double(c[ic]) - c[ig];
    a.strict += ic == ig;
    a.ties += gap <= tie;
    a.worst_gap = std::max(a.worst_gap, gap);
    double& m = row_max[size_t(t)];
    for (int64_t v = 0; v < V; ++v) m = std::isfinite(g[v]) ? std::max(m, std::abs(double(g[v]) - c[v])) : INFINITY;
    a.max_abs = std::max(a.max_abs, m);
  }
  std::sort(row_max.begin(), row_max.end(), std::greater<double>());
  const size_t out = std::max<size_t>(1, size_t(rows) / 100);
  a.max_abs_99 = out < row_max.size() ? row_max[out] : 0.0;
  a.top1 = double(a.strict) / double(rows);
  a.top1_ties = double(a.ties) / double(rows);
  return a;
}

// exp of the mean negative log-likelihood of ids[t + 1] under row t (rows 0 .. T-2), in double.
inline double perplexity(const float* logits, std::span<const int32_t> ids, int64_t V) {
  const int64_t T = int64_t(ids.size());
  double nll = 0;
  for (int64_t t = 0; t + 1 < T; ++t) {
    const float* r = logits + t * V;
    const double m = *std::max_element(r, r + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(r[v]) - m);
    nll += m + std::log(z) - double(r[ids[size_t(t + 1)]]);
  }
  return std::exp(nll / double(std::max<int64_t>(1, T - 1)));
}

// Teacher-forced over the prompt, once as one prompt pass (GEMM paths) and once a row per step (GEMV
// paths): top-1 ≥ 99.5% up to near-ties over both passes and ≥ 99% strictly in each, max |Δlogit| over all
// but the worst 1% of a pass's rows within 2e-2 of the logit scale, perplexity within 0.05% in each; then
// `greedy` tokens from the first 16 prompt tokens, identical. The CUDA backend runs with `gopt` (default: the
// prompt GEMMs in the high-precision split mode, whose results these fp32-class bounds are for). prompt_pass
// false: the decode pass alone is held to the bounds (tests of a decode path).
inline void compare_backends(std::shared_ptr<const ModelWeights> w, const std::vector<int32_t>& prompt, const char* what,
                             const cpu::CpuOptions& copt = {}, int greedy = 64,
                             const CudaOptions& gopt = high_precision_options(), bool prompt_pass = true) {
  const int64_t T = int64_t(prompt.size()), V = w->cfg.vocab;
  cpu::CpuBackend cpu(w, copt);
  auto gpu = make_cuda_backend(w, gopt);
  auto sc = cpu.new_state(T + 8);
  auto sg = gpu->new_state(T + 8);
  std::vector<float> lc(size_t(T * V)), lg(size_t(T * V)), ld(size_t(T * V));
  forward_step(cpu, *sc, prompt, T, lc.data());
  forward_step(*gpu, *sg, prompt, T, lg.data());
  sg->reset();
  for (int64_t t = 0; t < T; ++t) forward_step(*gpu, *sg, std::span(prompt).subspan(size_t(t), 1), 1, ld.data() + t * V);
  const double ppl_c = perplexity(lc.data(), prompt, V);
  int ties = 0;
  for (int pass = prompt_pass ? 0 : 1; pass < 2; ++pass) {
    const float* lgp = pass == 0 ? lg.data() : ld.data();
    const Agreement a = agreement(lgp, lc.data(), T, V);
    const double ppl_g = perplexity(lgp, prompt, V);
    const char* how = pass == 0 ? "prompt" : "decode";
    ties += a.ties;
    EXPECT_GE(a.top1, 0.99) << what << " " << how;
    EXPECT_LT(a.max_abs_99, 2e-2 * std::max(1.0, a.rms)) << what << " " << how;
    EXPECT_LT(std::abs(ppl_g / ppl_c - 1), 5e-4) << what << " " << how << " perplexity " << ppl_g << " vs " << ppl_c;
    std::printf("[%s] %s top-1 %.4f (up to near-ties %.4f, largest CPU logit gap of a CUDA pick %.3g), max|dlogit| %.3g "
                "(%.3g without the worst 1%% of rows), logit RMS %.3g, perplexity %.6g vs CPU %.6g (%+.2e)\n",
                what, how, a.top1, a.top1_ties, a.worst_gap, a.max_abs, a.max_abs_99, a.rms, ppl_g, ppl_c,
                ppl_g / ppl_c - 1);
  }
  EXPECT_GE(double(ties) / double((prompt_pass ? 2 : 1) * T), 0.995) << what << " top-1 up to near-ties over both passes";
  std::vector<float> row(static_cast<size_t>(V));
  const size_t P = std::min<size_t>(16, prompt.size());
  std::vector<int32_t> ids_c, ids_g;
  for (int b = 0; b < 2; ++b) {
    Backend& be = b == 0 ? static_cast<Backend&>(cpu) : *gpu;
    auto st = be.new_state(int64_t(P) + greedy + 8);
    std::vector<int32_t>& ids = b == 0 ? ids_c : ids_g;
    forward_step(be, *st, std::span(prompt).first(P), 1, row.data());
    ids.push_back(int32_t(argmax_row(row.data(), V)));
    while (int(ids.size()) < greedy) {
      forward_step(be, *st, std::span(ids).last(1), 1, row.data());
      ids.push_back(int32_t(argmax_row(row.data(), V)));
    }
  }
  EXPECT_EQ(ids_g, ids_c) << what << " greedy";
  std::printf("[%s] greedy %d tokens %s (CUDA vs CPU)\n", what, greedy, ids_g == ids_c ? "identical" : "differ");
}

}  // namespace lily::cudatest
#endif
