// The generation loop's speculative rounds (runtime/loop.h, runtime/spec.h): admission of a request's
// drafter, the draft phase before each step (MTP catch-up rows of every MTP request and the rounds' draft
// chains, batched into MTP steps), and the completion of a verification group.
#include <algorithm>
#include <random>

#include "core/error.h"
#include "model/qwen_hybrid.h"
#include "runtime/generate.h"
#include "runtime/loop_internal.h"
#include "runtime/verify.h"

namespace lily {

void GenerationLoop::start_spec(Seq& q) {
  const GenParams& p = q.p();
  validate(p.spec);
  const uint64_t seed = p.sampling.seed ? *p.sampling.seed ^ 0xd1b54a32d192ed03ull
                                        : (uint64_t(std::random_device{}()) << 32 | std::random_device{}());
  auto d = make_drafter(p.spec, engine_.weights(), seed);  // MTP without the block: names the missing tensors
  LILY_ASSERT(d != nullptr);
  if (d->uses_mtp() && !engine_.backend().can_mtp())
    fail("speculation with the MTP head needs MTP steps, which the {} backend does not run yet", engine_.backend().name());
  const int kmax = p.spec.depth > 0 ? p.spec.depth : p.spec.auto_max;
  q.spec = std::make_unique<SpecSeq>(d, kmax, d->uses_mtp());
  q.spec->depth = p.spec.depth;
  q.spec->typical = p.spec.typical;
  const bool sampled = p.sampling.temperature > 0.0f;
  // The device draws each verified row when it samples this request (one-hot drafts: accepting while the
  // draw equals the draft is exact speculative sampling); drafts from q and typical acceptance need the
  // target's distribution on the host.
  q.spec->host_verify = !q.device || p.constraint != nullptr || (sampled && p.spec.typical > 0.0f);
  q.spec->sample_drafts = q.spec->host_verify && sampled;
  if (q.spec->host_verify) q.device = false;  // every draw on the host: one sampler state, one history
  q.s->state().reserve_tentative(kmax + 1);
  q.res.spec.mode = d->name();
}

int GenerationLoop::round_depth(Seq& q) {
  SequenceState& S = q.s->state();
  const int64_t left = q.p().max_tokens - int64_t(q.generated.size());  // tokens the request may still emit
  const int64_t room = S.capacity() - S.n_tokens() - 1;                 // rows after the last token's
  const int64_t cap = std::min<int64_t>({left - 1, room, int64_t(S.max_tentative()) - 1});
  if (cap < 1) return 0;
  const int k = q.spec->depth > 0 ? q.spec->depth : q.spec->planner.choose(*costs_);
  return int(std::min<int64_t>(k, cap));
}

void GenerationLoop::draft_phase() {
  Backend& be = engine_.backend();
  const int64_t V = engine_.config().vocab;
  bool any_mtp = false;
  // rounds that start now: requests whose last token is known and nothing of theirs is in flight
  for (auto& up : seqs_) {
    Seq& q = *up;
    admit(q);  // a whole-prompt cache hit draws its first token here, and may start a round at once
    if (!q.spec || !q.alive) continue;
    any_mtp = any_mtp || q.spec->drafter->uses_mtp();
    q.spec->round = false;
    const bool ready = q.started && !q.job->cancelled.load() && q.pos >= q.p().prompt.size() && !q.full &&
                       q.drawn == q.fed + 1 && q.inflight == 0;
    if (!ready) continue;
    const int k = round_depth(q);
    if (k < 1) continue;
    DraftRequest r;
    r.tokens = q.text;
    r.k = k;
    r.sample = q.spec->sample_drafts ? &q.p().sampling : nullptr;
    try {
      q.spec->drafter->begin(r);
      q.spec->round = true;
      q.spec->k = k;
    } catch (const std::exception& e) {
      fail_seq(q, e, false);
    }
  }
  // MTP steps: the rows every MTP drafter asks for, one step per chain depth
  for (int it = 0; any_mtp && it < kMaxSpecDepth + 2; ++it) {
    auto f = std::make_unique<Flight>();
    Step& st = f->step;
    std::vector<Seq*> outs, id_outs;  // groups with a logits row / a device-drawn argmax, in group order
    bool full_head = false;             // a request of the step drafts from every id
    for (auto& up : seqs_) {
      Seq& q = *up;
      if (!q.spec || !q.alive || !q.started || !q.spec->drafter->uses_mtp()) continue;
      MtpRows rows;
      if (!q.spec->drafter->mtp_rows(q.text, q.s->state(), rows)) continue;
      if (rows.tokens.empty() || rows.tokens.size() != rows.hidden.size()) {
        fail_seq(q, InternalError("drafter '" + q.spec->drafter->name() + "' asked for malformed MTP rows"), false);
        continue;
      }
      const bool ids = rows.logits && rows.argmax && be.can_sample();  // only the argmax comes back
      st.add_mtp(q.s->state(), rows.tokens, rows.hidden, rows.logits ? 1 : 0, rows.logits && !ids, ids);
      // the step's head: the largest draft vocabulary of its requests (each stays lossless with any)
      const int64_t dv = q.p().spec.draft_vocab;
      if (dv <= 0 || dv >= V) full_head = true;
      else st.head_vocab = std::max<int32_t>(st.head_vocab, int32_t(dv));
      if (rows.logits) (ids ? id_outs : outs).push_back(&q);
    }
    if (st.groups.empty()) break;
    if (full_head) st.head_vocab = 0;
    try {
      if (outs.empty() && id_outs.empty()) {  // catch-up only: nobody waits for it, it finishes in order with the others
        f->ticket = forward(be, st);
        flights_.push_back(std::move(f));
        continue;
      }
      while (!flights_.empty()) {  // the drafts wait for this step's logits: earlier steps finish first
        std::unique_ptr<Flight> g = std::move(flights_.front());
        flights_.pop_front();
        complete(*g);
      }
      std::vector<float> logits(outs.size() * size_t(V));
      std::vector<int32_t> ids(id_outs.size());
      const double t0 = now_ms();
      be.finish(forward(be, st), StepOutputs{logits.empty() ? nullptr : logits.data(), ids.empty() ? nullptr : ids.data()});
      costs_->add_draft(now_ms() - t0);
      for (size_t i = 0; i < outs.size(); ++i)
        outs[i]->spec->drafter->mtp_logits(std::span<const float>(logits).subspan(i * size_t(V), size_t(V)));
      for (size_t i = 0; i < id_outs.size(); ++i) id_outs[i]->spec->drafter->mtp_id(ids[i]);
    } catch (const std::exception& e) {
      const bool input = dynamic_cast<const InputError*>(&e) != nullptr;
      for (const StepGroup& g : st.groups)
        for (auto& up : seqs_)
          if (&up->s->state() == g.seq && up->alive) fail_seq(*up, e, input);
    }
  }
  // the drafts (chain rows leave the MTP cache here)
  for (auto& up : seqs_) {
    Seq& q = *up;
    if (!q.spec || !q.spec->round) continue;
    q.spec->round = false;
    Draft d = q.spec->drafter->draft(q.s->state());
    if (!q.alive) continue;
    const std::string who = "drafter '" + q.spec->drafter->name() + "' ";
    if (d.tokens.size() > size_t(q.spec->k)) d.tokens.resize(size_t(q.spec->k));
    if (!d.q.empty() && d.q.size() < d.tokens.size()) {
      fail_seq(q, InternalError(who + "gave fewer draft distributions than tokens"), false);
      continue;
    }
    d.q.resize(d.q.empty() ? 0 : d.tokens.size());
    if (std::any_of(d.tokens.begin(), d.tokens.end(), [&](int32_t t) { return t < 0 || t >= V; })) {
      fail_seq(q, InternalError(who + "proposed a token id outside the vocabulary"), false);
      continue;
    }
    q.spec->draft = std::move(d);
  }
}

void GenerationLoop::note_kept(const Flight& f) {
  for (size_t g = 0; g < f.parts.size(); ++g) {
    const StepGroup& G = f.step.groups[g];
    Seq& q = *f.parts[g].q;
    if (G.keep_hidden && !G.tentative && q.spec) q.spec->drafter->kept(G.seq->n_tokens() - G.rows, G.rows);
  }
}

int GenerationLoop::verify_depth_of(const std::vector<Part>& parts) const {
  int k = -1;
  for (const Part& part : parts) {
    if (part.prompt) return -1;  // prompt rows: the step's time is no round's
    if (!part.q->spec || part.out_rows == 0) continue;
    k = std::max(k, int(part.draft.tokens.size()));
  }
  return k;
}

// Emits the round's tokens (accepted drafts, then the model's own token at the first rejection or after
// the last draft) through emit(), so every end condition applies per token, then commits the rows that
// absorbed emitted tokens: the last token and each accepted draft the request emitted.
void GenerationLoop::complete_verify(Seq& q, Part& part, const StepGroup& G, std::span<const int32_t> toks,
                                     std::span<const float> rows, std::span<const int32_t> ids) {
  const size_t V = size_t(engine_.config().vocab);
  const Draft& d = part.draft;
  const int k = int(d.tokens.size());
  SequenceState& S = q.s->state();
  const int64_t n0 = S.n_tokens();
  int acc = 0, evaluated = 0, emitted = 0, keep = 1;
  try {
    for (int i = 0; i <= k && q.alive; ++i) {
      const std::span<const float> row = rows.empty() ? std::span<const float>() : rows.subspan(size_t(i) * V, V);
      int32_t tok;
      bool ok = false;
      if (i < k) {
        ++evaluated;
        if (G.sample) {
          tok = ids[size_t(i)];
          ok = tok == d.tokens[size_t(i)];
        } else {
          std::span<const std::pair<int32_t, double>> qi;
          if (!d.q.empty()) qi = d.q[size_t(i)];
          const Verdict v = verify_draft(*q.sampler, masked(q, row), q.history, d.tokens[size_t(i)], qi, q.spec->typical);
          tok = v.token;
          ok = v.accepted;
        }
      } else {
        tok = G.sample ? ids[size_t(k)] : q.sampler->sample(masked(q, row), q.history);
      }
      note_draw(q, tok);
      ++emitted;
      if (ok) {
        ++acc;
        keep = i + 2;  // row i + 1 absorbed this draft
      }
      emit(q, tok, G.sample ? std::span<const float>() : row);
      if (!ok) break;
    }
  } catch (const InputError& e) {
    fail_seq(q, e, true);
  } catch (const std::exception& e) {
    fail_seq(q, e, false);
  }
  S.commit(keep);
  q.s->note_absorbed(toks.first(size_t(keep)), rows.empty() ? std::span<const float>() : rows.subspan(size_t(keep - 1) * V, V));
  q.fed += keep - 1;  // the first row's token was counted when the step was built
  if (G.keep_hidden) q.spec->drafter->kept(n0, keep);
  if (emitted > 0) {
    q.spec->drafter->verified(k, acc);
    q.spec->planner.observe(k, acc, evaluated);
    q.res.spec.add_round(k, acc, evaluated, emitted);
  }
  if (G.sample) {
    q.last_on_host = true;  // the device's last draw may be a discarded row: feed the next token explicitly
    const SamplingParams& sp = q.p().sampling;
    const bool penalties = sp.repetition_penalty != 1.0f || sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f;
    if (acc < k && penalties) {  // the device history holds the discarded draws: restart it
      ++q.spec->reseeds;
      q.device_ready = false;
    }
  }
}

}  // namespace lily
