// The generation loop's bookkeeping (runtime/loop.h), shared by its files: loop.cpp (admission, steps,
// emission, completion) and loop_spec.cpp (speculative rounds: drafting, verification). Not a public
// header.
#pragma once
#include <memory>
#include <vector>

#include "runtime/depth_planner.h"
#include "runtime/drafter.h"
#include "runtime/loop.h"

namespace lily {

// What one group of a submitted step means to the loop.
struct GenerationLoop::Part {
  Seq* q = nullptr;
  bool prompt = false;      // a prompt chunk (else a decode row, or a verification group)
  int64_t first = 0;        // prompt: position of the chunk's first row in the prompt
  int64_t fed_index = -1;   // decode row: index in Seq::drawn_ids of the id it absorbs
  int32_t rows = 0, out_rows = 0;
  bool logits = false, sample = false;
  bool last = false;        // prompt: the chunk that ends the prompt
  std::shared_ptr<Snapshot> snap;  // prompt cache entry taken after this chunk (logits filled on completion)
  Draft draft;              // a verification group: its rows are [last token, draft.tokens...]
};

struct GenerationLoop::Flight {
  uint64_t ticket = 0;
  Step step;
  std::vector<Part> parts;  // one per group (none for an MTP step, whose outputs nobody waits for)
  std::vector<float> logits;
  std::vector<int32_t> ids;
};

// A request's speculation (GenParams::spec).
struct SpecSeq {
  std::shared_ptr<Drafter> drafter;
  DepthPlanner planner;
  int depth = 0;             // fixed depth; 0: auto
  bool host_verify = true;   // verification reads logits on the host (else the device draws each row)
  bool sample_drafts = false;  // drafts drawn from the drafter's distribution (q)
  float typical = 0.0f;
  bool round = false;        // the current round's draft is being made
  int k = 0;                 // its most drafts
  Draft draft;               // the round's draft, verified by the next main step
  int reseeds = 0;           // device sampler restarts (after rejected rows, when penalties count history)
  SpecSeq(std::shared_ptr<Drafter> d, int kmax, bool mtp) : drafter(std::move(d)), planner(kmax, mtp) {}
};

struct GenerationLoop::Seq {
  std::shared_ptr<Job> job;
  Session* s = nullptr;
  double t_submit = 0, t_start = 0, t_first = 0;  // arrival, admission, first emitted token
  bool started = false;
  size_t pos = 0;            // prompt tokens submitted (cached ones included)
  bool device = false;       // draws on the backend's sampler
  bool device_ready = false; // set_sampling done
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> history;    // what the penalties count
  std::vector<int32_t> generated;  // emitted ids
  std::vector<int32_t> drawn_ids;  // every drawn id in order, emitted or discarded past the end
  std::vector<int32_t> base;       // the session's tokens before this request's prompt
  std::vector<int32_t> text;       // the whole sequence: base, prompt, emitted ids (drafters read it)
  int64_t drawn = 0;         // ids drawn (device: by submitted steps; host: emitted)
  int64_t fed = 0;           // drawn ids absorbed by submitted steps
  bool last_on_host = false; // the newest drawn id must be fed explicitly (host draw, or a verification)
  bool alive = true;         // no end condition yet
  bool full = false;         // the context cannot take another row
  int inflight = 0;          // submitted steps holding this request, not yet completed
  GenResult res;
  std::vector<float> scratch;
  std::unique_ptr<SpecSeq> spec;

  const GenParams& p() const { return job->params; }
  // its next row waits for its outputs
  bool sync() const { return !device || p().constraint != nullptr || spec != nullptr; }
};

}  // namespace lily
