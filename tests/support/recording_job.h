// Test support: a scheduler Job that records the tokens it is handed and lets the test wait for the end;
// requests stepped together in one generation loop.
#pragma once
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/loop.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"

namespace lily::test_support {

class RecordingJob : public Job {
 public:
  using Job::Job;
  bool on_token(int32_t t, std::span<const float> logits) override {
    ids.push_back(t);
    rows_with_logits += logits.empty() ? 0 : 1;
    return hook ? hook(t) : true;
  }
  void on_finish(const GenResult& r) override {
    std::lock_guard lk(mu);
    result = r;
    done = true;
    cv.notify_all();
  }
  GenResult wait() {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return done; });
    return result;
  }
  std::vector<int32_t> ids;
  int rows_with_logits = 0;
  std::function<bool(int32_t)> hook;  // return false to stop

 private:
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  GenResult result;
};

// The requests in one generation loop, each on its own session of `e`, stepped until all finished.
struct LoopRun {
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::shared_ptr<RecordingJob>> jobs;
  int steps = 0;
};
inline LoopRun run_together(Engine& e, const std::vector<GenParams>& ps, const LoopOptions& lo = {}) {
  LoopRun r;
  GenerationLoop loop(e, lo);
  for (const GenParams& p : ps) {
    r.sessions.push_back(std::make_unique<Session>(e));
    r.jobs.push_back(std::make_shared<RecordingJob>(p));
    loop.add(r.jobs.back(), *r.sessions.back(), GenerationLoop::now_ms());
  }
  while (!loop.empty()) {
    loop.step();
    ++r.steps;
  }
  return r;
}

}  // namespace lily::test_support
