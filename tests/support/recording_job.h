// Test support: a scheduler Job that records the tokens it is handed and lets the test wait for the end.
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/scheduler.h"

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

}  // namespace lily::test_support
