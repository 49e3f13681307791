// The bridge from the scheduler thread to an HTTP thread: a generation job that runs its text through
// the stop strings and an optional output splitter (reasoning, tool calls), and hands the results
// over as events on a channel. Knows nothing of any API's wire format.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "server/chat_format.h"
#include "server/stop_filter.h"
#include "text/tokenizer.h"

namespace lily::server {

struct LogprobItem {
  int32_t id = 0;
  std::string bytes;
  std::optional<float> lp;  // null: first prompt token
  std::vector<std::pair<int32_t, float>> top;
};

struct Event {
  enum Kind { Delta, Progress, PromptItems, Final } kind = Delta;
  OutputDelta delta;               // Delta: text released since the last event
  std::vector<LogprobItem> items;  // Delta: logprobs of the tokens behind `delta`; PromptItems: prompt rows
  int64_t done = 0, total = 0;     // Progress: prompt tokens absorbed of all
  GenResult result;                // Final (finish_reason "length" also when the deadline passed)
  double stream_ms = 0;            // Final: wall time from the first generated token to the last
  int reasoning_tokens = 0;        // Final
  int tool_calls = 0;              // Final
  std::vector<int32_t> ids;        // Final: every generated token id (stop ids excluded)
  std::string stop_sequence;       // Final: the stop string that ended the reply ("" when none did)
};

class Channel {
 public:
  void push(Event e);
  // Next event, or nothing after `timeout_ms` of silence.
  std::optional<Event> pop(int timeout_ms);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> q_;
};

// What clients received, over all finished jobs: the decode rate they saw is intervals / seconds.
struct StreamStats {
  std::atomic<uint64_t> intervals{0};  // gaps between consecutive tokens of a response
  std::atomic<uint64_t> micros{0};     // wall time from first to last token, summed
};

// top_logprobs < 0: no logprob items; progress: Progress events after each prefill chunk.
class GenJob : public Job {
 public:
  using Clock = std::chrono::steady_clock;
  GenJob(GenParams p, std::shared_ptr<const text::Tokenizer> tok, std::vector<std::string> stops,
         std::unique_ptr<OutputStream> parser, int top_logprobs, bool progress);

  Channel channel;
  std::shared_ptr<StreamStats> stats;  // may be null

  // A wall-clock limit: past it the job ends at its next step (or at once while queued) with
  // finish_reason "length".
  void set_deadline(Clock::time_point t) { deadline_ = t; }
  // Called by the waiting HTTP thread too: true (and the job cancelled) once the deadline has passed.
  bool check_deadline();
  // The job stops ("stop") once the output holds this many complete tool calls (0: no limit). Set
  // before the job is scheduled.
  void set_max_tool_calls(int n) { max_tool_calls_ = n; }

  void on_prefill(int64_t done, int64_t total) override;
  void on_prompt_logits(int64_t first, int64_t rows, std::span<const float> logits) override;
  bool on_token(int32_t t, std::span<const float> logits) override;
  void on_finish(const GenResult& r) override;

 private:
  struct Pending {
    size_t start, end;
    LogprobItem item;
  };
  LogprobItem item(int32_t id, std::optional<float> lp, std::vector<std::pair<int32_t, float>> top);
  OutputDelta split(const std::string& txt);
  void release(Event& e, bool final);

  std::shared_ptr<const text::Tokenizer> tok_;
  StopFilter filter_;
  std::unique_ptr<OutputStream> parser_;
  int top_logprobs_;
  bool progress_;
  std::optional<Clock::time_point> deadline_;
  std::atomic<bool> expired_{false};
  std::optional<Clock::time_point> first_token_, last_token_;
  std::deque<Pending> pending_;
  size_t total_bytes_ = 0;
  int reasoning_tokens_ = 0;
  int max_tool_calls_ = 0;
  std::vector<int32_t> ids_;
};

}  // namespace lily::server
