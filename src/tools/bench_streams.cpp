// `lily bench --streams` and `--verify`: several sequences decoding in the same steps, and the cost of a
// tentative verification step of k rows against a one-row step.
#include <algorithm>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "model/qwen_hybrid.h"
#include "runtime/loop.h"
#include "runtime/session.h"
#include "tools/bench.h"

namespace lily {

namespace {

// One session filled with `n` random tokens (prefill in the engine's chunks).
std::unique_ptr<Session> filled(Engine& e, int64_t cap, int64_t n, std::mt19937_64& rng) {
  auto s = std::make_unique<Session>(e, cap);
  std::uniform_int_distribution<int32_t> d(0, int32_t(e.config().vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = d(rng);
  std::vector<float> l(size_t(e.config().vocab));
  s->prefill(ids, l.data());
  return s;
}

}  // namespace

void bench_streams(Engine& engine, const BenchOptions& opt, BenchReport& rep) {
  if (opt.streams.empty()) return;
  Backend& be = engine.backend();
  const int64_t C = opt.stream_context, cap = C + opt.decode_tokens + 8;
  std::mt19937_64 rng(opt.seed + 1);
  if (opt.progress) fmt::print(stderr, "bench: streams at context {}: filling one sequence...\n", C);
  auto base = filled(engine, cap, C, rng);
  const Snapshot snap = base->snapshot();
  base.reset();
  std::uniform_int_distribution<int32_t> d(0, int32_t(engine.config().vocab - 1));
  for (int64_t N : opt.streams) {
    if (N < 1) fail("--streams: {} is not a stream count", N);
    std::vector<std::unique_ptr<Session>> sessions;
    for (int64_t i = 0; i < N; ++i) {
      sessions.push_back(std::make_unique<Session>(engine, cap));
      sessions.back()->restore(snap);  // every stream at C tokens (the same random context)
    }
    std::vector<double> agg, per, ttft;
    for (int r = 0; r <= opt.repeats; ++r) {
      for (auto& s : sessions) s->restore(snap);
      LoopOptions lo;
      lo.step_tokens = std::max<int64_t>(N, engine.options().prefill_chunk);
      GenerationLoop loop(engine, lo);
      std::vector<std::shared_ptr<BenchJob>> jobs;
      for (int64_t i = 0; i < N; ++i) {
        GenParams p;
        p.prompt = {d(rng)};
        p.max_tokens = opt.decode_tokens + 1;
        p.use_cache = false;
        jobs.push_back(std::make_shared<BenchJob>(p));
        loop.add(jobs.back(), *sessions[size_t(i)], GenerationLoop::now_ms());
      }
      be.synchronize();
      while (!loop.empty()) loop.step();
      be.synchronize();
      double worst = 0, sum = 0;
      std::vector<double> firsts;
      for (auto& j : jobs) {
        if (j->res.completion_tokens != opt.decode_tokens + 1)
          fail("bench: a stream produced {} of {} tokens ({})", j->res.completion_tokens, opt.decode_tokens + 1, j->res.finish_reason);
        worst = std::max(worst, j->res.decode_ms);
        sum += j->res.decode_ms;
        firsts.push_back(j->res.ttft_ms);
      }
      const double a = double(N * opt.decode_tokens) / (worst / 1e3), p = double(opt.decode_tokens) / (sum / double(N) / 1e3);
      if (r > 0) {
        agg.push_back(a);
        per.push_back(p);
        ttft.push_back(bench_median(firsts));
      }
      if (opt.progress)
        fmt::print(stderr, "bench: streams {:>3}: {} {:.1f} tok/s aggregate, {:.1f} per stream\n", N, r ? "run    " : "warm-up", a, p);
    }
    rep.streams.push_back({N, bench_median(agg), bench_median(per), bench_median(ttft)});
  }
}

void bench_verify(Engine& engine, const BenchOptions& opt, BenchReport& rep) {
  if (opt.verify.empty()) return;
  Backend& be = engine.backend();
  const int64_t V = engine.config().vocab;
  int64_t kmax = 1;
  for (int64_t k : opt.verify) {
    if (k < 1 || k > kMaxTentativeRows) fail("--verify: {} rows is outside 1..{}", k, kMaxTentativeRows);
    kmax = std::max(kmax, k);
  }
  std::mt19937_64 rng(opt.seed + 2);
  if (opt.progress) fmt::print(stderr, "bench: verification steps at context {}: filling...\n", opt.stream_context);
  auto s = filled(engine, opt.stream_context + kmax + 8, opt.stream_context, rng);
  SequenceState& st = s->state();
  st.reserve_tentative(int(kmax));
  std::uniform_int_distribution<int32_t> d(0, int32_t(V - 1));
  // The outputs a verification needs for every row: drawn ids where the backend samples, else logits.
  const bool ids = be.can_sample();
  if (ids) be.set_sampling(st, DeviceSampling{}, {});
  std::vector<float> logits(size_t(kmax) * size_t(V));
  std::vector<int32_t> drawn(static_cast<size_t>(kmax));
  // A plain one-row step (rolled back by restoring a snapshot, untimed) against tentative k-row steps
  // (rolled back by commit(0)).
  const Snapshot at = s->snapshot();
  auto time_step = [&](int64_t k, bool tentative) {
    std::vector<double> ms;
    for (int r = 0; r < 2 + 3 * opt.repeats; ++r) {
      std::vector<int32_t> toks(static_cast<size_t>(k));
      for (auto& t : toks) t = d(rng);
      Step step;
      step.add(st, toks, int32_t(k), !ids, ids, tentative);
      be.synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      be.finish(forward(be, step), StepOutputs{ids ? nullptr : logits.data(), ids ? drawn.data() : nullptr});
      be.synchronize();
      const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (tentative) st.commit(0);
      else st.restore(*at.state);
      if (r >= 2) ms.push_back(dt);
    }
    return bench_median(ms);
  };
  const double one = time_step(1, false);
  for (int64_t k : opt.verify) {
    VerifyRow row;
    row.rows = k;
    row.one_row_ms = one;
    row.step_ms = time_step(k, true);
    rep.verify.push_back(row);
    if (opt.progress) fmt::print(stderr, "bench: verify {:>2} rows: {:.3f} ms ({:.2f}x one row)\n", k, row.step_ms, row.ratio());
  }
}

}  // namespace lily
