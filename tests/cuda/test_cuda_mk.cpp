// The decode step as one persistent kernel (backend/cuda/mk.h): the plan's partition (no GPU needed), then
// steps through the kernel against the per-block kernels on the same weights — logits of one-row steps at
// contexts that end on and around the attention splits and stages, device-drawn greedy ids fed back
// (kFedToken), and the runtime's generation loop on top.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaMk, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/mk.h"
#include "cuda_compare.h"
#include "cuda_test_util.h"
#include "model/qwen_hybrid.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "tools/synth.h"

namespace {
using namespace lily;
namespace mk = lily::cuda::mk;

// Every tile of every op in exactly one task; each block's tasks in op order; dependencies resolved to the
// counters and task counts of the ops waited for (through ops without tiles); oversized stages refused.
TEST(CudaMk, PlanPartitionsEveryTileOnce) {
  const std::vector<int> tiles = {1, 5, 132, 133, 0, 264, 7, 0, 0, 3};
  for (int blocks : {1, 3, 7, 132}) {
    mk::Plan p;
    std::vector<int> ids;
    for (size_t i = 0; i < tiles.size(); ++i) {
      mk::OpDesc op;
      op.type = mk::kGemv;
      op.ntiles = tiles[i];
      op.stage_bytes = uint32_t(1024 * (i + 1));
      ids.push_back(p.add(op, i == 0 ? std::vector<int>{} : std::vector<int>{ids.back()}));
    }
    const int extra = p.counter(3);
    p.finalize(blocks, 64 * 1024);
    const auto& ops = p.ops();
    std::vector<std::vector<int>> seen(tiles.size());
    for (int b = 0; b < blocks; ++b) {
      int prev = -1;
      for (int t = p.task_begin()[size_t(b)]; t < p.task_begin()[size_t(b) + 1]; ++t) {
        const mk::Task& k = p.tasks()[size_t(t)];
        EXPECT_GT(k.op, prev) << "block " << b << ": tasks out of op order";
        prev = k.op;
        EXPECT_LT(k.t0, k.t1);
        for (int x = k.t0; x < k.t1; ++x) seen[size_t(k.op)].push_back(x);
      }
    }
    for (size_t i = 0; i < tiles.size(); ++i) {
      std::vector<int> s = seen[i];
      std::sort(s.begin(), s.end());
      ASSERT_EQ(int(s.size()), tiles[i]) << "op " << i << " blocks " << blocks;
      for (int x = 0; x < tiles[i]; ++x) EXPECT_EQ(s[size_t(x)], x);
      EXPECT_EQ(ops[i].ntasks, std::min(tiles[i], blocks));
    }
    // op i waits for the nearest earlier op with tiles (ops 4, 7, 8 have none)
    for (size_t i = 1; i < tiles.size(); ++i) {
      size_t d = i - 1;
      while (d > 0 && tiles[d] == 0) --d;
      EXPECT_EQ(ops[i].dep[0], ops[d].done) << "op " << i;
      EXPECT_EQ(ops[i].dep_n[0], uint32_t(ops[d].ntasks)) << "op " << i;
      EXPECT_EQ(ops[i].dep[1], -1) << "op " << i;
    }
    EXPECT_EQ(ops[0].dep[0], -1);
    std::set<int> counters;
    for (const auto& op : ops) counters.insert(op.done);
    EXPECT_EQ(counters.size(), tiles.size());
    EXPECT_EQ(p.counters(), int(tiles.size()) + 3 + 1);  // ops, the extra ones, the blocks' finish counter
    EXPECT_EQ(extra, int(tiles.size()));
    EXPECT_EQ(p.stage_bytes(), uint32_t(1024 * tiles.size()));
  }
  mk::Plan big;
  mk::OpDesc op;
  op.ntiles = 1;
  op.stage_bytes = 50000;
  big.add(op, {});
  EXPECT_THROW(big.finalize(4, 40000), InternalError);
}

std::vector<int32_t> ids_for(int64_t n, int64_t vocab, uint64_t salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = int32_t((uint64_t(i) * 7919u + 13u + salt * 104729u) % uint64_t(vocab));
  return v;
}

CudaOptions mk_options(bool on) {
  CudaOptions o = cudatest::high_precision_options();
  o.mk = on;
  return o;
}

// One-row steps after prompts of ctx - 1 tokens: the kernel's logits against the per-block kernels' (the
// prompt itself runs the same prompt kernels on both). Contexts around the 32-key stages and the
// attention splits; 4 decode steps each. A routing near-tie that flips one step carries into the later steps
// of its context (the states differ), so diverged contexts are counted, not steps.
void compare_steps(const char* preset, SynthFormat f, const std::vector<int64_t>& contexts) {
  SynthOptions so;
  so.preset = preset;
  so.format = f;
  so.seed = 11;
  auto w = synth_model(so);
  const int64_t V = w->cfg.vocab;
  auto ref = make_cuda_backend(w, mk_options(false));
  auto mkb = make_cuda_backend(w, mk_options(true));
  const std::string what = std::string(preset) + " " + synth_format_name(f);
  ASSERT_EQ(cuda_mk_info(*mkb).uncovered, "") << what;
  std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
  int64_t steps = 0, far_contexts = 0;
  for (int64_t ctx : contexts) {
    bool diverged = false;  // a routing near-tie flipped: the states differ for the rest of this context
    auto sa = ref->new_state(ctx + 8);
    auto sb = mkb->new_state(ctx + 8);
    const std::vector<int32_t> prompt = ids_for(ctx - 1, V, uint64_t(ctx));
    if (ctx > 1) {
      forward_step(*ref, *sa, prompt, 1, la.data());
      forward_step(*mkb, *sb, prompt, 1, lb.data());
    }
    for (int s = 0; s < 4; ++s) {
      const int32_t tok = int32_t((ctx * 31 + s * 17) % V);
      forward_step(*ref, *sa, std::span(&tok, 1), 1, la.data());
      forward_step(*mkb, *sb, std::span(&tok, 1), 1, lb.data());
      ++steps;
      double ss = 0, worst = 0;
      for (int64_t v = 0; v < V; ++v) {
        ss += double(la[size_t(v)]) * la[size_t(v)];
        worst = std::max(worst, std::abs(double(la[size_t(v)]) - lb[size_t(v)]));
        ASSERT_TRUE(std::isfinite(lb[size_t(v)])) << what << " ctx " << ctx << " step " << s << " logit " << v;
      }
      const double rms = std::sqrt(ss / double(V));
      const int64_t ia = std::max_element(la.begin(), la.end()) - la.begin();
      const int64_t ib = std::max_element(lb.begin(), lb.end()) - lb.begin();
      // the two paths sum in other orders (attention, DeltaNet, norms) and the kernel's 4-bit products take
      // bf16 hi + lo activations: 1e-2 · RMS (the CUDA comparison tests bound each path's distance to the CPU
      // at 2e-2 · RMS); as there, a near tie between two experts may route one step differently
      const bool far = worst >= 1e-2 * std::max(1.0, rms);
      far_contexts += far && !diverged;
      if (far) std::printf("[%s] ctx %lld step %d: max|dlogit| %.3g (a routing near-tie?)\n", what.c_str(), (long long)ctx, s, worst);
      diverged |= far;
      EXPECT_TRUE(diverged || ia == ib || la[size_t(ia)] - la[size_t(ib)] < 1e-2 * std::max(1.0, rms))
          << what << " ctx " << ctx << " step " << s << ": argmax " << ib << " vs " << ia;
      if (s == 3) std::printf("[%s] ctx %lld: max|dlogit| %.3g (logit RMS %.3g)\n", what.c_str(), (long long)ctx, worst, rms);
    }
  }
  EXPECT_LE(far_contexts, std::max<int64_t>(1, int64_t(contexts.size()) / 4)) << what << ": contexts beyond 1e-2 · RMS";
  const int64_t one_row_prompts = std::count(contexts.begin(), contexts.end(), int64_t(2));
  EXPECT_EQ(cuda_mk_info(*mkb).steps, steps + one_row_prompts) << what << ": every one-row step ran the kernel";
}

TEST(CudaMk, StepKernelMatchesBlocksTiny) {
  LILY_REQUIRE_GPU();
  for (auto f : {SynthFormat::BF16, SynthFormat::Affine4, SynthFormat::Affine8})
    compare_steps("tiny-stacked", f, {1, 2, 31, 32, 33, 255, 256, 257, 4097});
}

// The fidelity bar on the kernel's path: the CUDA comparison against the CPU backend (cuda_compare.h:
// teacher-forced top-1, perplexity, 64 greedy tokens) of its one-row steps, which run the kernel (the prompt
// pass runs the prompt GEMMs and is held to the bar by CudaSynth).
TEST(CudaMk, MatchesCpuEveryFormat) {
  LILY_REQUIRE_GPU();
  for (auto f : {SynthFormat::BF16, SynthFormat::Affine4, SynthFormat::Affine8}) {
    SynthOptions so;
    so.preset = "tiny-stacked";
    so.format = f;
    so.seed = 7;
    auto w = synth_model(so);
    std::vector<int32_t> prompt = ids_for(160, w->cfg.vocab, 1);
    cpu::CpuOptions copt;
    copt.affine = cpu::AffinePath::Exact;
    const std::string what = std::string("tiny-stacked step kernel ") + synth_format_name(f);
    cudatest::compare_backends(w, prompt, what.c_str(), copt, 64, mk_options(true), /*prompt_pass=*/false);
  }
}

TEST(CudaMk, StepKernelMatchesBlocksRealShapes) {
  LILY_REQUIRE_GPU();
  compare_steps("small", SynthFormat::Affine4, {1, 2, 255, 256, 4097, 32769});
  compare_steps("small", SynthFormat::BF16, {2, 4097});
  compare_steps("qwen3.5-35b-a3b", SynthFormat::Affine4, {2, 4097});
}

// Greedy generation through the runtime's device-sampled loop (ids drawn by the kernel's head, fed back as
// kFedToken): the same tokens with the kernel on and off.
TEST(CudaMk, DeviceGreedyLoopMatches) {
  LILY_REQUIRE_GPU();
  for (const char* preset : {"tiny-stacked", "small"}) {
    SynthOptions so;
    so.preset = preset;
    so.format = SynthFormat::Affine4;
    so.seed = 5;
    auto w = synth_model(so);
    std::vector<std::vector<int32_t>> out;
    for (bool on : {false, true}) {
      EngineOptions eo;
      eo.ctx_size = 512;
      auto engine = Engine::from_backend(w, make_cuda_backend(w, mk_options(on)), eo);
      Session s(*engine);
      GenerateOptions g;
      g.max_tokens = 48;
      const GenerateResult r = generate(s, ids_for(40, w->cfg.vocab, 3), g);
      EXPECT_TRUE(r.device_sampled) << preset;
      out.push_back(r.tokens);
      if (on) {
        EXPECT_GE(cuda_mk_info(engine->backend()).steps, 40) << preset;
      }
    }
    EXPECT_EQ(out[0], out[1]) << preset;
  }
}

}  // namespace
#endif
