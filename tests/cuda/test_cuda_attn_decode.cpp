// Timing of decode attention: attn_core at T = 1 (q/k prep + KV append, the split decode kernel, the
// combine) on the Qwen3.5-35B-A3B shape (Hq 16, Hkv 2, head_dim 256), at the splits attn_splits picks.
// Runs only when LILY_CUDA_BENCH is set. The calls are captured in a CUDA graph (PDL edges included) so
// host launch cost stays out; "stream" repeats the calls with plain launches for comparison.
// "cold": call i reads KV cache i of a pool of caches over 256 MiB (far above L2), as the 10 attention
// layers of a decode step do; "hot": every call reads the same cache (L2-resident when it fits).
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaAttnDecodeBench, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "cuda_test_util.h"

namespace {
using lily::cudatest::Dev;
using lily::cudatest::randn;
using lily::cudatest::randn_bf16;

TEST(CudaAttnDecodeBench, Shape35B) {
  LILY_REQUIRE_GPU();
  if (!std::getenv("LILY_CUDA_BENCH")) GTEST_SKIP() << "set LILY_CUDA_BENCH=1 to run";
  const int Hq = 16, Hkv = 2, hd = 256, rot = 64, PW = Hq * 2 * hd + 2 * Hkv * hd;
  const int reps = 200, replays = 5;
  std::mt19937 rng(71);
  Dev<float> dqn(std::vector<float>(hd, 1.f)), dkn(std::vector<float>(hd, 1.f));
  Dev<float> dp(randn(PW, rng, 1.f)), dout(size_t(Hq) * hd);
  lily::cuda::AttnDev a;
  a.Hq = Hq; a.Hkv = Hkv; a.hd = hd; a.rot = rot; a.theta = 1e7f; a.q_norm = dqn.p; a.k_norm = dkn.p;
  cudaStream_t s;
  LILY_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  LILY_CU(cudaEventCreate(&e0));
  LILY_CU(cudaEventCreate(&e1));
  std::printf("attn decode, Hq 16 Hkv 2 hd 256, T 1 (us per attn_core call; GB/s: K+V bytes read per call / cold graph time)\n");
  std::printf("attn decode      ctx  splits  graph cold  graph hot  stream cold    GB/s\n");
  for (const int64_t ctx : {int64_t(256), int64_t(4096), int64_t(32768)}) {
    const int64_t cap = ctx;
    const size_t per = size_t(Hkv) * cap * hd;  // bf16 elements of one K (or V) cache
    const size_t kv_bytes = 2 * per * sizeof(uint16_t);
    const int pool = int(std::max<size_t>(2, (size_t(256) << 20) / kv_bytes + 1));
    Dev<uint16_t> kc(per * pool), vc(per * pool);
    kc.up(randn_bf16(per, rng, 1.f).first);
    vc.up(randn_bf16(per, rng, 1.f).first);
    for (int i = 1; i < pool; ++i) {
      LILY_CU(cudaMemcpy(kc.p + per * i, kc.p, per * 2, cudaMemcpyDeviceToDevice));
      LILY_CU(cudaMemcpy(vc.p + per * i, vc.p, per * 2, cudaMemcpyDeviceToDevice));
    }
    Dev<int64_t> pos(std::vector<int64_t>{ctx - 1});  // the call appends key ctx - 1 and attends to all ctx keys
    const int ns = lily::cuda::attn_splits(a, 1, ctx);
    Dev<char> scratch(lily::cuda::attn_scratch_bytes(a, 1, ns));
    auto call = [&](int i) {
      lily::cuda::attn_core(a, dp.p, 1, pos.p, kc.p + per * size_t(i % pool), vc.p + per * size_t(i % pool), cap, ns,
                            dout.p, scratch.p, s);
    };
    auto elapsed_us = [&](float ms, int calls) { return 1e3 * double(ms) / calls; };
    for (int i = 0; i < 3; ++i) call(i);
    LILY_CU(cudaStreamSynchronize(s));

    float ms = 0;
    LILY_CU(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; ++i) call(i);
    LILY_CU(cudaEventRecord(e1, s));
    LILY_CU(cudaEventSynchronize(e1));
    LILY_CU(cudaEventElapsedTime(&ms, e0, e1));
    const double stream_cold = elapsed_us(ms, reps);

    double graph_us[2];
    for (int hot = 0; hot < 2; ++hot) {
      cudaGraph_t graph;
      cudaGraphExec_t ex;
      LILY_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < reps; ++i) call(hot ? 0 : i);
      LILY_CU(cudaStreamEndCapture(s, &graph));
      LILY_CU(cudaGraphInstantiate(&ex, graph, 0));
      LILY_CU(cudaGraphLaunch(ex, s));  // warm-up
      LILY_CU(cudaEventRecord(e0, s));
      for (int r = 0; r < replays; ++r) LILY_CU(cudaGraphLaunch(ex, s));
      LILY_CU(cudaEventRecord(e1, s));
      LILY_CU(cudaEventSynchronize(e1));
      LILY_CU(cudaEventElapsedTime(&ms, e0, e1));
      graph_us[hot] = elapsed_us(ms, reps * replays);
      LILY_CU(cudaGraphExecDestroy(ex));
      LILY_CU(cudaGraphDestroy(graph));
    }
    std::printf("attn decode  %7lld  %6d  %10.2f  %9.2f  %11.2f  %6.0f\n", static_cast<long long>(ctx), ns, graph_us[0],
                graph_us[1], stream_cold, double(kv_bytes) / (graph_us[0] * 1e-6) / 1e9);
    const auto out = dout.down();
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
  }
  LILY_CU(cudaEventDestroy(e0));
  LILY_CU(cudaEventDestroy(e1));
  LILY_CU(cudaStreamDestroy(s));
}

}  // namespace
#endif
