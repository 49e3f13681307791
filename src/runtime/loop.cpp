#include "runtime/loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "model/qwen_hybrid.h"
#include "runtime/generate.h"
#include "runtime/loop_internal.h"

namespace lily {

DeviceSampling GenerationLoop::device_sampling_for(const Seq& q) {
  const GenParams& p = q.p();
  DeviceSampling d = device_sampling(p.sampling);
  d.logit_bias = p.logit_bias;
  d.vocab_limit = p.sample_vocab;
  // a restart after rejected verification rows continues with a fresh stream, not the seed's first draws
  if (q.spec) d.seed += uint64_t(q.spec->reseeds) * 0x9E3779B97F4A7C15ull;
  return d;
}

double GenerationLoop::now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

GenerationLoop::GenerationLoop(Engine& engine, const LoopOptions& opt)
    : engine_(engine), opt_(opt), costs_(opt.costs ? opt.costs : &own_costs_) {
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
  q.text = q.base;
  q.text.insert(q.text.end(), p.prompt.begin(), p.prompt.end());
  if (p.spec.on()) start_spec(q);
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

void GenerationLoop::admit(Seq& q) {
  if (q.started) return;
  try {
    start(q);
  } catch (const InputError& e) {
    fail_seq(q, e, true);
  } catch (const std::exception& e) {
    fail_seq(q, e, false);
  }
}

int32_t GenerationLoop::host_draw(Seq& q, std::span<const float> logits) {
  const int32_t t = q.sampler->sample(masked(q, logits), q.history);
  note_draw(q, t);
  return t;
}

void GenerationLoop::note_draw(Seq& q, int32_t t) {
  ++q.drawn;
  q.drawn_ids.push_back(t);
}

std::span<const float> GenerationLoop::masked(Seq& q, std::span<const float> logits) {
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
  return row;
}

// The one place where a token comes out and the end conditions are checked.
void GenerationLoop::emit(Seq& q, int32_t tok, std::span<const float> logits) {
  if (!q.alive) return;  // a draw past the end (the pipeline ran ahead): discarded
  const GenParams& p = q.p();
  q.generated.push_back(tok);
  q.history.push_back(tok);
  q.text.push_back(tok);
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
    admit(q);
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
    const bool verify = next && q.spec && !q.spec->draft.tokens.empty();
    int32_t tok = kFedToken;
    if (absorb_last || q.last_on_host || !q.device || verify) tok = q.generated.back();
    part.fed_index = q.fed;
    if (verify) {  // [last token, d1..dk], tentative, outputs on every row (runtime/loop_spec.cpp)
      part.draft = std::move(q.spec->draft);
      q.spec->draft = {};
      part.rows = part.out_rows = int32_t(part.draft.tokens.size()) + 1;
      part.logits = q.spec->host_verify;
      part.sample = !q.spec->host_verify;
    } else if (next && q.drawn < q.p().max_tokens) {
      part.out_rows = 1;
      part.sample = q.device;
      part.logits = !q.device;
    }
    if (part.sample) {
      if (!q.device_ready) {
        be.set_sampling(S, device_sampling_for(q), q.history);
        q.device_ready = true;
      }
      if (q.p().constraint) be.set_mask(S, q.p().constraint->allowed());
    }
    std::vector<int32_t> toks = {tok};
    toks.insert(toks.end(), part.draft.tokens.begin(), part.draft.tokens.end());
    st.add(S, toks, part.out_rows, part.logits, part.sample, verify);
    st.groups.back().keep_hidden = q.spec && q.spec->drafter->uses_mtp();
    parts.push_back(std::move(part));
    ++q.fed;
    q.last_on_host = false;
    if (parts.back().sample && !verify) ++q.drawn;  // a verification counts its draws on completion
    if (parts.back().out_rows > 0 && q.sync()) sync = true;
    budget -= parts.back().rows;
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
      be.set_sampling(S, device_sampling_for(q), q.history);
      q.device_ready = true;
      if (p.constraint) be.set_mask(S, p.constraint->allowed());
    }
    st.add(S, std::span(p.prompt).subspan(q.pos, size_t(part.rows)), part.out_rows, part.logits, part.sample);
    st.groups.back().keep_hidden = q.spec && q.spec->drafter->uses_mtp();
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
    std::span<const int32_t> ids;
    if (G.sample && G.out_rows > 0) {
      ids = std::span<const int32_t>(f.ids).subspan(irow, size_t(G.out_rows));
      id = ids.back();
      irow += size_t(G.out_rows);
    }
    if (G.tentative) {  // a verification round
      complete_verify(q, part, G, std::span(f.step.tokens).subspan(size_t(G.first), size_t(G.rows)), rows, ids);
      continue;
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
  draft_phase();  // MTP catch-up rows and the drafts of this step's verification rounds
  auto f = std::make_unique<Flight>();
  bool sync = false;
  bool any = build(f->step, f->parts, sync);
  int timed_k = -1;  // the step's verification depth when its time measures one (RoundCosts)
  double t0 = 0;
  if (any) {
    const int64_t V = engine_.config().vocab;
    f->logits.resize(size_t(f->step.logit_rows()) * size_t(V));
    f->ids.resize(size_t(f->step.sample_rows()));
    for (Part& part : f->parts) ++part.q->inflight;
    timed_k = verify_depth_of(f->parts);
    t0 = now_ms();
    try {
      f->ticket = forward(engine_.backend(), f->step);
    } catch (const std::exception& e) {
      fail_step(*f, e);
      any = false;
    }
  }
  if (any) {
    note_kept(*f);
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
  if (any && timed_k >= 0 && flights_.empty()) costs_->add_verify(timed_k, now_ms() - t0);
  return reap();
}

// A step the backend refused: its requests end with the error (none of its rows was absorbed).
void GenerationLoop::fail_step(Flight& f, const std::exception& e) {
  const bool input = dynamic_cast<const InputError*>(&e) != nullptr;
  for (Part& part : f.parts) {
    --part.q->inflight;
    if (part.q->alive) fail_seq(*part.q, e, input);
  }
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
