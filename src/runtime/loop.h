// The generation loop: the one place where requests advance, stop and end. Each call of step() runs one
// forward step over every active request (continuous batching): a decoding request contributes one row,
// waiting prompts are chunked into the same step up to a row budget, and every row's token is drawn by
// the backend's sampler (ids only come back) or, for requests that need logits (logprobs) or a backend
// without a sampler, by the host sampler. Steps whose outputs the next step does not wait for are
// pipelined: the next step is queued before the previous one's ids are read, the device feeding each
// drawn id into the next step itself (kFedToken).
//
// Per request the contract is Job's (runtime/request.h): tokens come out in order; a stop id, on_token
// returning false, max_tokens, a full context or cancellation end it; afterwards its session holds the
// prompt and every emitted token that fits (the same end state on every path).
//
// Speculative requests (GenParams::spec, runtime/spec.h) run rounds: before each step the loop runs the
// MTP steps their drafters ask for (one MTP step holding every such request's rows), then the step holds
// each round's verification as a tentative group [last token, d1..dk] with outputs on every row; its
// completion emits the accepted drafts and the model's own next token and commits those rows.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/depth_planner.h"
#include "runtime/engine.h"
#include "runtime/prompt_cache.h"
#include "runtime/request.h"
#include "runtime/session.h"

namespace lily {

struct LoopOptions {
  int64_t step_tokens = 0;    // rows per step when prompts wait (0: the engine's prefill chunk)
  int64_t prefill_chunk = 0;  // prompt rows of one request per step (0: the engine's prefill chunk)
  PromptCache* cache = nullptr;  // prompt-cache lookups at admission and saves (GenParams::use_cache)
  // Measured round costs for draft depth auto (runtime/depth_planner.h); null: the loop keeps its own.
  RoundCosts* costs = nullptr;
};

class GenerationLoop {
 public:
  struct Finished {
    Session* session;
    std::shared_ptr<Job> job;
    GenResult result;
  };

  GenerationLoop(Engine& engine, const LoopOptions& opt);
  ~GenerationLoop();

  // Starts a request on `session` (which may hold a prefix the request's prompt continues, or is reset
  // when a cache hit or a fresh start needs it). The session must outlive the request; t_submit_ms is
  // the request's arrival (for queue_ms).
  void add(std::shared_ptr<Job> job, Session& session, double t_submit_ms);
  // One forward step (or, when nothing can be stepped, the completion of queued work). Returns the
  // requests that ended during it (their on_finish has run; their sessions are free again).
  std::vector<Finished> step();
  bool empty() const { return seqs_.empty(); }
  size_t size() const { return seqs_.size(); }
  // Ends every request as "cancelled" (after the device work in flight), without further steps.
  std::vector<Finished> cancel_all();

  static double now_ms();

 private:
  struct Seq;
  struct Part;
  struct Flight;
  void start(Seq& q);
  void admit(Seq& q);  // start() once, a failure ending the request
  void emit(Seq& q, int32_t tok, std::span<const float> logits);
  int32_t host_draw(Seq& q, std::span<const float> logits);
  void note_draw(Seq& q, int32_t tok);
  std::span<const float> masked(Seq& q, std::span<const float> logits);  // logit_bias, vocab limit, constraint
  static DeviceSampling device_sampling_for(const Seq& q);
  void fail_seq(Seq& q, const std::exception& e, bool input);
  void fail_step(Flight& f, const std::exception& e);
  bool build(Step& st, std::vector<Part>& parts, bool& sync);
  void complete(Flight& f);
  std::vector<Finished> reap();
  // speculation (loop_spec.cpp)
  void start_spec(Seq& q);
  void draft_phase();
  int round_depth(Seq& q);
  void note_kept(const Flight& f);
  int verify_depth_of(const std::vector<Part>& parts) const;
  void complete_verify(Seq& q, Part& part, const StepGroup& G, std::span<const int32_t> toks, std::span<const float> rows,
                       std::span<const int32_t> ids);

  Engine& engine_;
  LoopOptions opt_;
  RoundCosts own_costs_;
  RoundCosts* costs_;
  std::vector<std::unique_ptr<Seq>> seqs_;  // admission order
  std::deque<std::unique_ptr<Flight>> flights_;  // submitted steps not yet finished, oldest first
};

}  // namespace lily
