#include "runtime/loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "model/qwen_hybrid.h"
#include "runtime/generate.h"

namespace lily {

// What one group of a submitted step means to the loop.
struct GenerationLoop::Part {
  Seq* q = nullptr;
  bool prompt = false;      // a prompt chunk (else a decode row)
  int64_t first = 0;        // prompt: position of the chunk's first row in the prompt
  int64_t fed_index = -1;   // decode row: index in Seq::drawn_ids of the id it absorbs
  int32_t rows = 0, out_rows = 0;
  bool logits = false, sample = false;
  bool last = false;        // prompt: the chunk that ends the prompt
  std::shared_ptr<Snapshot> snap;  // prompt cache entry taken after this chunk (logits filled on completion)
};

struct GenerationLoop::Flight {
  uint64_t ticket = 0;
  Step step;
  std::vector<Part> parts;
  std::vector<float> logits;
  std::vector<int32_t> ids;
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
  int64_t drawn = 0;         // ids drawn (device: by submitted steps; host: emitted)
  int64_t fed = 0;           // drawn ids absorbed by submitted steps
  bool last_on_host = false; // the newest drawn id came from the host sampler (fed explicitly)
  bool alive = true;         // no end condition yet
  bool full = false;         // the context cannot take another row
  int inflight = 0;          // submitted steps holding this request, not yet completed
  GenResult res;
  std::vector<float> scratch;

  const GenParams& p() const { return job->params; }
  bool sync() const { return !device || p().constraint != nullptr; }  // its next row waits for its outputs
};

namespace {
DeviceSampling device_sampling_for(const GenParams& p) {
  DeviceSampling d = device_sampling(p.sampling);
  d.logit_bias = p.logit_bias;
  d.vocab_limit = p.sample_vocab;
  return d;
}
}  // namespace

double GenerationLoop::now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

GenerationLoop::GenerationLoop(Engine& engine, const LoopOptions& opt) : engine_(engine), opt_(opt) {
  if (opt_.prefill_chunk <= 0) opt_.prefill_chunk = engine.options().prefill_chunk;
  if (opt_.step_tokens <= 0) opt_.step_tokens = opt_.prefill_chunk;
  LILY_CHECK(opt_.prefill_chunk > 0 && opt_.step_tokens > 0, "step sizes must be positive");
}

GenerationLoop::~GenerationLoop() {
  try {
    cancel_all();
  } catch (...) {
  }
}

void GenerationLoop::add(std::shared_ptr<Job> job, Session& session, double t_submit_ms) {
  auto q = std::make_unique<Seq>();
  q->job = std::move(job);
  q->s = &session;
  q->t_submit = t_submit_ms;
  seqs_.push_back(std::move(q));
}

// Admission: validation, the prompt cache, the sampler. Throws InputError for a bad request.
void GenerationLoop::start(Seq& q) {
  q.started = true;
  q.t_start = now_ms();
  q.res.queue_ms = q.t_start - q.t_submit;
  const GenParams& p = q.p();
  Session& s = *q.s;
  q.res.prompt_tokens = int64_t(p.prompt.size());
  validate(p.sampling);
  LILY_CHECK(p.max_tokens >= 0, "max_tokens must be >= 0 (got {})", p.max_tokens);
  const int64_t V = engine_.config().vocab;
  for (int32_t t : p.prompt)
    if (t < 0 || t >= V) fail("prompt token id {} is outside the model's vocabulary (0..{})", t, V - 1);
  if (p.prompt.empty() && s.n_tokens() == 0) fail("the prompt is empty");
  if (s.n_tokens() + int64_t(p.prompt.size()) >= s.capacity())
    fail("the prompt has {} tokens (+{} in the context) but the context size is {}", p.prompt.size(), s.n_tokens(),
         s.capacity());
  Backend& be = engine_.backend();
  q.device = p.allow_device && !p.token_logits && be.can_sample();
  q.sampler = std::make_unique<Sampler>(p.sampling);
  if (p.penalize_prompt) {
    q.history = s.tokens();
    q.history.insert(q.history.end(), p.prompt.begin(), p.prompt.end());
  }
  if (opt_.cache && p.use_cache && !p.prompt_logits && s.n_tokens() == 0) {
    auto snap = opt_.cache->lookup(p.prompt);
    if (snap && snap->tokens.size() == p.prompt.size() && snap->last_logits.empty())  // nothing left to draw from
      snap = opt_.cache->lookup(std::span(p.prompt).first(p.prompt.size() - 1));
    if (snap) {
      s.restore(*snap);
      q.pos = snap->tokens.size();
      q.res.cached_tokens = int64_t(q.pos);
    }
  }
  q.base = s.tokens();
  if (q.pos > 0) q.base.resize(q.base.size() - q.pos);
  q.job->on_prefill(int64_t(q.pos), int64_t(p.prompt.size()));
  if (q.pos == p.prompt.size()) {
    // nothing to prefill (the whole prompt was cached, or the session already holds it): the first
    // token comes from the logits after it, on the host
    LILY_CHECK(!s.last_logits().empty(), "nothing to generate from: the session holds no logits");
    if (p.max_tokens == 0) {
      q.alive = false;
      q.res.finish_reason = "length";
      return;
    }
    const std::vector<float> row = s.last_logits();
    const int32_t t = host_draw(q, row);
    q.last_on_host = true;
    emit(q, t, row);
  }
}

int32_t GenerationLoop::host_draw(Seq& q, std::span<const float> logits) {
  const GenParams& p = q.p();
  const int64_t V = int64_t(logits.size());
  std::span<const float> row = logits;
  if (!p.logit_bias.empty() || (p.sample_vocab > 0 && p.sample_vocab < V) || p.constraint) {
    q.scratch.assign(logits.begin(), logits.end());
    for (auto [t, b] : p.logit_bias)
      if (t >= 0 && t < V) q.scratch[size_t(t)] += b;
    if (p.sample_vocab > 0)
      for (int64_t t = p.sample_vocab; t < V; ++t) q.scratch[size_t(t)] = -INFINITY;
    if (p.constraint) {
      const std::span<const uint64_t> m = p.constraint->allowed();
      LILY_ASSERT(int64_t(m.size()) * 64 >= V);
      for (int64_t t = 0; t < V; ++t)
        if (!(m[size_t(t >> 6)] >> (t & 63) & 1)) q.scratch[size_t(t)] = -INFINITY;
    }
    row = q.scratch;
  }
  const int32_t t = q.sampler->sample(row, q.history);
  ++q.drawn;
  q.drawn_ids.push_back(t);
  return t;
}

// The one place where a token comes out and the end conditions are checked.
void GenerationLoop::emit(Seq& q, int32_t tok, std::span<const float> logits) {
  if (!q.alive) return;  // a draw past the end (the pipeline ran ahead): discarded
  const GenParams& p = q.p();
  q.generated.push_back(tok);
  q.history.push_back(tok);
  q.res.completion_tokens = int64_t(q.generated.size());
  if (q.generated.size() == 1) {
    q.t_first = now_ms();
    q.res.ttft_ms = q.t_first - q.t_start;
  }
  if (p.constraint) p.constraint->accept(tok);
  auto end = [&](const char* why) {
    q.alive = false;
    q.res.finish_reason = why;
  };
  if (std::find(p.stop_ids.begin(), p.stop_ids.end(), tok) != p.stop_ids.end()) {
    q.res.stop_token = tok;
    end("stop");
  } else if (!q.job->on_token(tok, logits)) {
    end("stop");
  } else if (int64_t(q.generated.size()) >= p.max_tokens) {
    end("length");
  } else if (q.full && q.drawn == int64_t(q.generated.size())) {
    end("length");  // no row can absorb it, no further draw is coming
  }
}

void GenerationLoop::fail_seq(Seq& q, const std::exception& e, bool input) {
  q.alive = false;
  q.res.finish_reason = "error";
  q.res.error = e.what();
  q.res.error_is_input = input;
}

// Builds the next step from every request that can take a row. sync: the step's outputs must be read
// before the next step is built.
bool GenerationLoop::build(Step& st, std::vector<Part>& parts, bool& sync) {
  Backend& be = engine_.backend();
  sync = false;
  int64_t budget = opt_.step_tokens;
  // decode rows first: one per request (or the row that absorbs an ended request's last token)
  for (auto& up : seqs_) {
    Seq& q = *up;
    if (!q.started) {
      try {
        start(q);
      } catch (const InputError& e) {
        fail_seq(q, e, true);
      } catch (const std::exception& e) {
        fail_seq(q, e, false);
      }
    }
    if (q.alive && q.job->cancelled.load()) {
      q.alive = false;
      q.res.finish_reason = "cancelled";
    }
    if (q.pos < q.p().prompt.size()) continue;  // still prefilling
    if (q.res.finish_reason == "cancelled" || q.res.finish_reason == "error") continue;
    const bool absorb_last = !q.alive && int64_t(q.generated.size()) > q.fed && q.inflight == 0;
    const bool next = q.alive && !q.full && q.drawn == q.fed + 1 && (!q.sync() || q.inflight == 0);
    if (!absorb_last && !next) continue;
    SequenceState& S = q.s->state();
    if (S.n_tokens() + 1 > S.capacity()) {
      q.full = true;
      if (q.alive && q.drawn == int64_t(q.generated.size())) {
        q.alive = false;
        q.res.finish_reason = "length";
      }
      continue;
    }
    Part part;
    part.q = &q;
    part.rows = 1;
    int32_t tok = kFedToken;
    if (absorb_last || q.last_on_host || !q.device) tok = q.generated.back();
    part.fed_index = q.fed;
    if (next && q.drawn < q.p().max_tokens) {
      part.out_rows = 1;
      part.sample = q.device;
      part.logits = !q.device;
    }
    if (part.sample) {
      if (!q.device_ready) {
        be.set_sampling(S, device_sampling_for(q.p()), q.history);
        q.device_ready = true;
      }
      if (q.p().constraint) be.set_mask(S, q.p().constraint->allowed());
    }
    st.add(S, std::span(&tok, 1), part.out_rows, part.logits, part.sample);
    parts.push_back(std::move(part));
    ++q.fed;
    q.last_on_host = false;
    if (parts.back().sample) ++q.drawn;
    if (parts.back().out_rows > 0 && q.sync()) sync = true;
    --budget;
  }
  // prompt chunks in admission order with the rows left
  for (auto& up : seqs_) {
    Seq& q = *up;
    const GenParams& p = q.p();
    if (!q.alive || q.pos >= p.prompt.size() || budget <= 0) continue;
    size_t end = std::min({p.prompt.size(), q.pos + size_t(opt_.prefill_chunk), q.pos + size_t(budget)});
    bool at_boundary = false;
    for (size_t b : p.boundaries)
      if (b > q.pos && b <= end && b < p.prompt.size()) {
        end = b;
        at_boundary = true;
      }
    const bool caching = opt_.cache && p.use_cache && !p.prompt_logits;
    Part part;
    part.q = &q;
    part.prompt = true;
    part.first = int64_t(q.pos);
    part.rows = int32_t(end - q.pos);
    part.last = end == p.prompt.size();
    if (p.prompt_logits) {
      part.out_rows = part.rows;
      part.logits = true;
    } else if (part.last || (at_boundary && caching)) {
      part.out_rows = 1;
      part.logits = !q.device || caching || !part.last || p.max_tokens == 0;
    }
    if (part.last && p.max_tokens > 0 && q.device) {
      part.out_rows = std::max(part.out_rows, 1);
      part.sample = true;
    }
    SequenceState& S = q.s->state();
    if (part.sample) {
      be.set_sampling(S, device_sampling_for(p), q.history);
      q.device_ready = true;
      if (p.constraint) be.set_mask(S, p.constraint->allowed());
    }
    st.add(S, std::span(p.prompt).subspan(q.pos, size_t(part.rows)), part.out_rows, part.logits, part.sample);
    if (part.sample) ++q.drawn;
    if (part.last && p.max_tokens > 0 && q.sync()) sync = true;
    if (p.prompt_logits) sync = true;  // its rows are handed over in order with the request's progress
    q.pos = end;
    budget -= part.rows;
    parts.push_back(std::move(part));
  }
  return !parts.empty();
}

// Reads a completed step's outputs and hands them to their requests.
void GenerationLoop::complete(Flight& f) {
  const int64_t V = engine_.config().vocab;
  engine_.backend().finish(f.ticket, StepOutputs{f.logits.empty() ? nullptr : f.logits.data(),
                                                  f.ids.empty() ? nullptr : f.ids.data()});
  size_t lrow = 0, irow = 0;
  const double t = now_ms();
  for (size_t g = 0; g < f.parts.size(); ++g) {
    Part& part = f.parts[g];
    const StepGroup& G = f.step.groups[g];
    Seq& q = *part.q;
    --q.inflight;
    std::span<const float> rows;
    if (G.logits && G.out_rows > 0) {
      rows = std::span<const float>(f.logits).subspan(lrow * size_t(V), size_t(G.out_rows) * size_t(V));
      lrow += size_t(G.out_rows);
    }
    int32_t id = -1;
    if (G.sample && G.out_rows > 0) {
      id = f.ids[irow + size_t(G.out_rows) - 1];
      irow += size_t(G.out_rows);
    }
    // the tokens the step absorbed (a fed row's id was drawn by an earlier step, completed before this
    // one), and the logits after them
    {
      const auto toks = std::span(f.step.tokens).subspan(size_t(G.first), size_t(G.rows));
      std::vector<int32_t> absorbed(toks.begin(), toks.end());
      if (!part.prompt) {
        LILY_ASSERT(part.fed_index >= 0 && part.fed_index < int64_t(q.drawn_ids.size()));
        absorbed[0] = q.drawn_ids[size_t(part.fed_index)];
      }
      q.s->note_absorbed(absorbed, rows.empty() ? std::span<const float>() : rows.last(size_t(V)));
    }
    if (id >= 0) q.drawn_ids.push_back(id);
    try {
      if (part.prompt) {
        if (q.p().prompt_logits && !rows.empty()) q.job->on_prompt_logits(part.first, part.rows, rows);
        if (part.snap) {
          part.snap->last_logits.assign(rows.end() - V, rows.end());
          if (opt_.cache) opt_.cache->insert(part.snap);
        }
        q.job->on_prefill(part.first + part.rows, int64_t(q.p().prompt.size()));
        if (part.last) {
          q.res.prefill_ms = t - q.t_start;
          if (q.p().max_tokens == 0) {
            q.alive = false;
            q.res.finish_reason = "length";
          }
        }
      }
      if (G.out_rows > 0 && (!part.prompt || part.last) && q.p().max_tokens > 0) {
        if (G.sample) {
          emit(q, id, {});
        } else if (q.alive) {
          const std::span<const float> row = rows.last(size_t(V));
          emit(q, host_draw(q, row), row);
        }
      }
    } catch (const InputError& e) {
      fail_seq(q, e, true);
    } catch (const std::exception& e) {
      fail_seq(q, e, false);
    }
  }
}

std::vector<GenerationLoop::Finished> GenerationLoop::reap() {
  std::vector<Finished> done;
  for (size_t i = 0; i < seqs_.size();) {
    Seq& q = *seqs_[i];
    const bool absorb_pending = int64_t(q.generated.size()) > q.fed && !q.full && q.res.finish_reason != "cancelled" &&
                                q.res.finish_reason != "error";
    if (q.alive || q.inflight > 0 || absorb_pending) {
      ++i;
      continue;
    }
    const GenParams& p = q.p();
    q.res.device_sampled = q.device;
    q.res.decode_ms = q.t_first > 0 ? now_ms() - q.t_first : 0.0;  // first emitted token to the end
    const std::string& why = q.res.finish_reason;
    const bool keep = q.started && opt_.cache && p.use_cache && !p.prompt_logits && why != "cancelled" &&
                      why != "error" && q.pos == p.prompt.size() && q.s->n_tokens() > 0;
    if (keep) {
      try {
        opt_.cache->insert(std::make_shared<Snapshot>(q.s->snapshot()));
      } catch (const std::exception&) {
        // the answer is delivered; a failed cache save only costs a later prefill
      }
    }
    q.job->on_finish(q.res);
    done.push_back({q.s, q.job, q.res});
    seqs_.erase(seqs_.begin() + std::ptrdiff_t(i));
  }
  return done;
}

std::vector<GenerationLoop::Finished> GenerationLoop::step() {
  auto f = std::make_unique<Flight>();
  bool sync = false;
  const bool any = build(f->step, f->parts, sync);
  if (any) {
    const int64_t V = engine_.config().vocab;
    f->logits.resize(size_t(f->step.logit_rows()) * size_t(V));
    f->ids.resize(size_t(f->step.sample_rows()));
    for (Part& part : f->parts) ++part.q->inflight;
    f->ticket = forward(engine_.backend(), f->step);
    // prompt-cache entries at boundaries and prompt ends: the state right after this step
    for (size_t g = 0; g < f->parts.size(); ++g) {
      Part& part = f->parts[g];
      const GenParams& p = part.q->p();
      if (!part.prompt || !opt_.cache || !p.use_cache || p.prompt_logits || part.out_rows == 0) continue;
      Seq& q = *part.q;
      auto snap = std::make_shared<Snapshot>();
      snap->tokens = q.base;
      snap->tokens.insert(snap->tokens.end(), p.prompt.begin(), p.prompt.begin() + part.first + part.rows);
      snap->state = q.s->state().snapshot();
      part.snap = std::move(snap);
    }
    flights_.push_back(std::move(f));
  }
  // completions: all of them when the next step depends on these outputs (or nothing else can run),
  // otherwise all but the newest (the pipeline keeps one step queued on the device)
  while (!flights_.empty() && (sync || !any || flights_.size() > 1)) {
    std::unique_ptr<Flight> g = std::move(flights_.front());
    flights_.pop_front();
    complete(*g);
  }
  return reap();
}

std::vector<GenerationLoop::Finished> GenerationLoop::cancel_all() {
  for (auto& q : seqs_)
    if (q->alive || q->res.finish_reason.empty()) {
      q->alive = false;
      q->res.finish_reason = "cancelled";
    }
  while (!flights_.empty()) {
    std::unique_ptr<Flight> g = std::move(flights_.front());
    flights_.pop_front();
    complete(*g);
  }
  return reap();
}

}  // namespace lily
