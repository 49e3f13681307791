// The scheduler's on-device decode path (Scheduler::device_steps), exercised on the CPU through a backend
// that implements Backend::decode_on_device's contract with the host sampler: a job running alone and
// needing no per-token logits decodes there, yields to a newcomer, and ends exactly like the host path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../support/contract_backend.h"
#include "../support/recording_job.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace lily {
namespace {

using HostLoopBackend = lily::test_support::ContractBackend;

using TestJob = lily::test_support::RecordingJob;

class SchedulerDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    w = ModelWeights::load(std::string(LILY_TEST_DATA) + "/golden/qwen3_5_moe_text-a");
    host = Engine::from_weights(w, EngineOptions{"cpu", 256, 64});
    auto b = std::make_unique<HostLoopBackend>(w);
    dev_backend = b.get();
    dev = Engine::from_backend(w, std::move(b), EngineOptions{"cpu", 256, 64});
  }
  static GenParams params(int64_t max_tokens) {
    GenParams p;
    p.prompt = {5, 17, 33, 2, 250, 101, 7};
    p.max_tokens = max_tokens;
    p.token_logits = false;
    p.use_cache = false;
    return p;
  }
  // Runs one job alone on a fresh scheduler over `e`.
  static std::pair<std::vector<int32_t>, GenResult> run(Engine& e, GenParams p) {
    Scheduler s(e, SchedulerOptions{});
    auto j = std::make_shared<TestJob>(std::move(p));
    EXPECT_TRUE(s.submit(j));
    GenResult r = j->wait();
    return {j->ids, r};
  }
  std::shared_ptr<const ModelWeights> w;
  std::unique_ptr<Engine> host, dev;
  HostLoopBackend* dev_backend = nullptr;
};

TEST_F(SchedulerDevice, GreedyMatchesTheHostPathAndEndsByLength) {
  auto [want, wr] = run(*host, params(12));
  auto [got, gr] = run(*dev, params(12));
  EXPECT_EQ(got, want);
  EXPECT_EQ(gr.finish_reason, "length");
  EXPECT_EQ(wr.finish_reason, "length");
  EXPECT_EQ(gr.completion_tokens, 12);
  EXPECT_EQ(dev_backend->calls, 1);
  EXPECT_EQ(dev_backend->tokens, 12);
}

TEST_F(SchedulerDevice, StopIdEndsWithoutReachingTheJob) {
  auto [want, wr] = run(*host, params(12));
  ASSERT_GE(want.size(), 4u);
  GenParams p = params(12);
  p.stop_ids = {want[3]};
  const size_t first = size_t(std::find(want.begin(), want.end(), want[3]) - want.begin());
  auto [got, gr] = run(*dev, p);
  EXPECT_EQ(gr.finish_reason, "stop");
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + std::ptrdiff_t(first)));  // the stop id is not shown
  EXPECT_EQ(gr.completion_tokens, int64_t(first) + 1);                                         // but counted
  auto [hgot, hr] = run(*host, p);
  EXPECT_EQ(hgot, got);
  EXPECT_EQ(hr.completion_tokens, gr.completion_tokens);
}

TEST_F(SchedulerDevice, LogprobsAndLogitBiasStayOnTheHost) {
  GenParams p = params(5);
  p.token_logits = true;
  run(*dev, p);
  GenParams q = params(5);
  q.logit_bias = {{3, 1.0f}};
  run(*dev, q);
  EXPECT_EQ(dev_backend->calls, 0);
}

TEST_F(SchedulerDevice, VocabLimitIsHonoured) {
  auto [free, fr] = run(*host, params(10));
  ASSERT_TRUE(std::any_of(free.begin(), free.end(), [](int32_t t) { return t >= 40; })) << "the limit would not bind";
  GenParams p = params(10);
  p.sample_vocab = 40;
  auto [want, wr] = run(*host, p);
  auto [got, gr] = run(*dev, p);
  EXPECT_EQ(got, want);
  for (int32_t t : got) EXPECT_LT(t, 40);
  EXPECT_EQ(dev_backend->calls, 1);
}

TEST_F(SchedulerDevice, JobStopAndCancel) {
  {
    Scheduler s(*dev, SchedulerOptions{});
    auto j = std::make_shared<TestJob>(params(20));
    j->hook = [&](int32_t) { return j->ids.size() < 3; };
    ASSERT_TRUE(s.submit(j));
    GenResult r = j->wait();
    EXPECT_EQ(r.finish_reason, "stop");
    EXPECT_EQ(j->ids.size(), 3u);
    EXPECT_EQ(j->rows_with_logits, 0);
  }
  {
    Scheduler s(*dev, SchedulerOptions{});
    auto j = std::make_shared<TestJob>(params(20));
    j->hook = [&](int32_t) {
      if (j->ids.size() == 2) j->cancel();
      return true;
    };
    ASSERT_TRUE(s.submit(j));
    GenResult r = j->wait();
    EXPECT_EQ(r.finish_reason, "cancelled");
    EXPECT_EQ(j->ids.size(), 2u);
  }
}

// A second request arriving mid-generation: the first leaves the device loop and both finish on the host
// path, interleaved, with the tokens each gets alone.
TEST_F(SchedulerDevice, YieldsToANewcomerAndBothMatchTheirSoloRuns) {
  GenParams pa = params(16), pb = params(8);
  pb.prompt = {9, 8, 7, 6, 5};
  auto [want_a, ra] = run(*host, pa);
  auto [want_b, rb] = run(*host, pb);
  SchedulerOptions o;
  o.parallel = 2;
  Scheduler s(*dev, o);
  auto a = std::make_shared<TestJob>(pa);
  auto b = std::make_shared<TestJob>(pb);
  a->hook = [&](int32_t) {
    if (a->ids.size() == 3) {
      EXPECT_TRUE(s.submit(b));
    }
    return true;
  };
  ASSERT_TRUE(s.submit(a));
  GenResult gb = b->wait(), ga = a->wait();
  EXPECT_EQ(a->ids, want_a);
  EXPECT_EQ(b->ids, want_b);
  EXPECT_EQ(ga.finish_reason, "length");
  EXPECT_EQ(gb.finish_reason, "length");
  EXPECT_GE(dev_backend->calls, 1);
  EXPECT_LT(dev_backend->tokens, 16 + 8);  // a left the device loop once b arrived
}

}  // namespace
}  // namespace lily
