// The scheduler on the CPU, over the plain CPU backend (host sampling) and over one with an emulated device
// sampler (tests/support/sampling_backend.h): concurrent requests share steps and each gets the tokens it
// gets alone; stop ids, job stops, cancellation, logprobs, vocabulary limits and the prompt cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../support/recording_job.h"
#include "../support/sampling_backend.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace lily {
namespace {

using DeviceSampler = lily::test_support::SamplingCpuBackend;

using TestJob = lily::test_support::RecordingJob;

class SchedulerDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    w = ModelWeights::load(std::string(LILY_TEST_DATA) + "/golden/qwen3_5_moe_text-a");
    host = Engine::from_weights(w, EngineOptions{"cpu", 256, 64});
    auto b = std::make_unique<DeviceSampler>(w);
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
  DeviceSampler* dev_backend = nullptr;
};

TEST_F(SchedulerDevice, GreedyMatchesTheHostPathAndEndsByLength) {
  auto [want, wr] = run(*host, params(12));
  const int64_t before = dev_backend->draws;
  auto [got, gr] = run(*dev, params(12));
  EXPECT_EQ(got, want);
  EXPECT_EQ(gr.finish_reason, "length");
  EXPECT_EQ(wr.finish_reason, "length");
  EXPECT_EQ(gr.completion_tokens, 12);
  EXPECT_TRUE(gr.device_sampled);
  EXPECT_EQ(dev_backend->draws - before, 12);
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
  EXPECT_EQ(gr.stop_token, want[3]);
  auto [hgot, hr] = run(*host, p);
  EXPECT_EQ(hgot, got);
  EXPECT_EQ(hr.completion_tokens, gr.completion_tokens);
}

TEST_F(SchedulerDevice, LogprobsStayOnTheHostAndLogitBiasOnTheDevice) {
  const int64_t before = dev_backend->draws;
  GenParams p = params(5);
  p.token_logits = true;
  auto [a, ra] = run(*dev, p);
  EXPECT_FALSE(ra.device_sampled);
  EXPECT_EQ(dev_backend->draws, before);
  GenParams q = params(5);
  q.logit_bias = {{3, 100.0f}};
  auto [b, rb] = run(*dev, q);
  EXPECT_TRUE(rb.device_sampled);
  EXPECT_EQ(b, std::vector<int32_t>(5, 3));
  auto [c, rc] = run(*host, q);
  EXPECT_EQ(c, b);
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
  EXPECT_TRUE(gr.device_sampled);
}

TEST_F(SchedulerDevice, JobStopAndCancel) {
  for (Engine* e : {host.get(), dev.get()}) {
    {
      Scheduler s(*e, SchedulerOptions{});
      auto j = std::make_shared<TestJob>(params(20));
      j->hook = [&](int32_t) { return j->ids.size() < 3; };
      ASSERT_TRUE(s.submit(j));
      GenResult r = j->wait();
      EXPECT_EQ(r.finish_reason, "stop");
      EXPECT_EQ(j->ids.size(), 3u);
    }
    {
      Scheduler s(*e, SchedulerOptions{});
      auto j = std::make_shared<TestJob>(params(20));
      j->hook = [&](int32_t) {
        if (j->ids.size() == 2) j->cancel();
        return true;
      };
      ASSERT_TRUE(s.submit(j));
      GenResult r = j->wait();
      EXPECT_EQ(r.finish_reason, "cancelled");
      EXPECT_LE(j->ids.size(), 4u);  // within a step (the pipeline may have one more id in flight)
      s.stop();  // the counters are updated after on_finish
      EXPECT_EQ(s.stats().cancelled, 1u);
    }
  }
}

// Concurrent requests (greedy and seeded sampling, different prompts and lengths, arriving while others
// decode) each get the tokens they get alone, on both paths.
TEST_F(SchedulerDevice, ConcurrentRequestsGetTheirSoloTokens) {
  for (Engine* e : {host.get(), dev.get()}) {
    std::vector<GenParams> ps;
    for (int i = 0; i < 6; ++i) {
      GenParams p = params(6 + 2 * i);
      p.prompt.push_back(int32_t(40 + i));
      for (int k = 0; k < i; ++k) p.prompt.push_back(int32_t(k * 13 % 300));
      if (i % 2) {
        p.sampling.temperature = 0.7f;
        p.sampling.seed = uint64_t(i);
      }
      ps.push_back(p);
    }
    std::vector<std::vector<int32_t>> solo;
    for (auto& p : ps) solo.push_back(run(*e, p).first);
    SchedulerOptions o;
    o.parallel = 4;
    Scheduler s(*e, o);
    std::vector<std::shared_ptr<TestJob>> jobs;
    for (auto& p : ps) jobs.push_back(std::make_shared<TestJob>(p));
    jobs[0]->hook = [&](int32_t) {
      if (jobs[0]->ids.size() == 2) {
        for (size_t i = 3; i < jobs.size(); ++i) EXPECT_TRUE(s.submit(jobs[i]));
      }
      return true;
    };
    for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(s.submit(jobs[i]));
    for (size_t i = 0; i < jobs.size(); ++i) {
      const GenResult r = jobs[i]->wait();
      EXPECT_EQ(jobs[i]->ids, solo[i]) << e->backend().name() << " request " << i;
      EXPECT_EQ(r.finish_reason, "length");
    }
  }
}

TEST_F(SchedulerDevice, PromptCacheHitPrefillsOnlyTheSuffix) {
  for (Engine* e : {host.get(), dev.get()}) {
    Scheduler s(*e, SchedulerOptions{});
    GenParams p = params(5);
    p.use_cache = true;
    auto a = std::make_shared<TestJob>(p);
    ASSERT_TRUE(s.submit(a));
    const GenResult ra = a->wait();
    EXPECT_EQ(ra.cached_tokens, 0);
    auto b = std::make_shared<TestJob>(p);  // the same prompt: all of it cached
    ASSERT_TRUE(s.submit(b));
    const GenResult rb = b->wait();
    EXPECT_EQ(rb.cached_tokens, int64_t(p.prompt.size()));
    EXPECT_EQ(b->ids, a->ids);
    GenParams q = p;  // the conversation goes on: the first answer and more
    q.prompt.insert(q.prompt.end(), a->ids.begin(), a->ids.end());
    q.prompt.push_back(9);
    auto c = std::make_shared<TestJob>(q);
    ASSERT_TRUE(s.submit(c));
    const GenResult rc = c->wait();
    EXPECT_EQ(rc.cached_tokens, int64_t(p.prompt.size() + a->ids.size())) << "the end of the first request was saved";
    GenParams fresh = q;
    fresh.use_cache = false;
    EXPECT_EQ(c->ids, run(*e, fresh).first);
  }
}

}  // namespace
}  // namespace lily
