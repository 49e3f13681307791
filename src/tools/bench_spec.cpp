// `lily bench --spec mtp|ngram [--acceptance A,..] [--spec-depth K,..|auto]`: speculative decoding at
// stream_context with its full cost (the drafter's own steps, the verification) but a known acceptance.
// Random weights make any drafter's acceptance meaningless, so a first pass decodes plainly (greedy: the
// baseline rate and the continuation), and an oracle replaces each drafted token by the continuation's
// with probability a, by another token otherwise (per position, so the acceptance at a position given
// the earlier ones is a). Where a verification step's arithmetic (it depends on the row count) decides a
// near-tie otherwise than the plain pass, the run leaves the continuation and its drafts would all miss:
// such a run is repeated with its own output as the continuation until it reproduces it
// (reproduce_continuation), and only a run that does counts. Round costs per depth come from the loop's
// own timings (RoundCosts); the depth auto would pick at acceptance 0.5, 0.7, 0.86, 0.95 from them.
#include <algorithm>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/drafter.h"
#include "runtime/loop.h"
#include "runtime/session.h"
#include "tools/bench.h"

namespace lily {

namespace {

class OracleDrafter final : public DrafterWrapper {
 public:
  OracleDrafter(std::shared_ptr<Drafter> inner, std::vector<int32_t> truth, size_t prompt_len, double a,
                int64_t vocab, uint64_t seed)
      : DrafterWrapper(std::move(inner)), truth_(std::move(truth)), prompt_len_(prompt_len), a_(a), vocab_(vocab), rng_(seed) {}
  void begin(const DraftRequest& r) override {
    at_ = r.tokens.size() - prompt_len_;  // continuation tokens emitted so far
    inner_->begin(r);
  }
  Draft draft(SequenceState& st) override {
    Draft d = inner_->draft(st);
    if (a_ < 0) return d;
    std::uniform_real_distribution<double> U(0.0, 1.0);
    std::uniform_int_distribution<int64_t> other(1, vocab_ - 1);
    for (size_t i = 0; i < d.tokens.size(); ++i) {
      const size_t j = at_ + i;
      const int32_t t = j < truth_.size() ? truth_[j] : 0;
      d.tokens[i] = U(rng_) < a_ ? t : int32_t((t + other(rng_)) % vocab_);
    }
    d.q.clear();
    return d;
  }

 private:
  const std::vector<int32_t> truth_;
  size_t prompt_len_, at_ = 0;
  double a_;
  int64_t vocab_;
  std::mt19937_64 rng_;
};

// One request of `n` tokens after `prompt` on `s` in its own loop; its tokens (the stop id has none).
GenResult run_one(Engine& e, Session& s, const std::vector<int32_t>& prompt, int64_t n, SpecParams sp, RoundCosts* costs,
                  std::vector<int32_t>* out) {
  GenParams p;
  p.prompt = prompt;
  p.max_tokens = n;
  p.use_cache = false;
  p.spec = std::move(sp);
  LoopOptions lo;
  lo.costs = costs;
  GenerationLoop loop(e, lo);
  auto job = std::make_shared<BenchJob>(p);
  e.backend().synchronize();
  loop.add(job, s, GenerationLoop::now_ms());
  while (!loop.empty()) loop.step();
  e.backend().synchronize();
  if (job->res.finish_reason == "error") fail("bench: {}", job->res.error);
  if (out) *out = job->ids;
  return job->res;
}

double rate(const GenResult& r) {
  return r.decode_ms > 0 && r.completion_tokens > 1 ? double(r.completion_tokens - 1) / (r.decode_ms / 1e3) : 0.0;
}

}  // namespace

int reproduce_continuation(std::vector<int32_t>& truth, const std::function<std::vector<int32_t>(const std::vector<int32_t>&)>& run,
                           int max_passes) {
  for (int pass = 0; pass < max_passes; ++pass) {
    std::vector<int32_t> got = run(truth);
    if (got == truth) return pass;
    truth = std::move(got);
  }
  return -1;
}

void bench_spec(Engine& engine, const BenchOptions& opt, BenchReport& rep) {
  if (opt.spec.empty()) return;
  SpecParams base;
  base.mode = parse_spec_mode(opt.spec, "--spec");
  if (base.mode == SpecMode::Off) return;
  base.draft_vocab = opt.spec_vocab;
  validate(base);
  if (opt.spec_vocab > engine.config().vocab)
    fail("--spec-vocab {} exceeds the vocabulary ({})", opt.spec_vocab, engine.config().vocab);
  if (base.mode == SpecMode::Mtp) engine.weights().require_mtp();
  for (double a : opt.acceptance)
    if (!(a >= 0.0 && a <= 1.0)) fail("--acceptance: {} is not a probability in [0, 1]", a);
  for (int k : opt.spec_depth)
    if (k < 0 || k > kMaxSpecDepth) fail("--spec-depth: {} is outside 1..{} (or auto)", k, kMaxSpecDepth);
  const int64_t C = opt.stream_context, V = engine.config().vocab, n = opt.decode_tokens + 1;
  SpecReport sr;
  sr.mode = opt.spec;
  sr.context = C;
  sr.draft_vocab = opt.spec_vocab;
  std::mt19937_64 rng(opt.seed + 3);
  std::uniform_int_distribution<int32_t> d(0, int32_t(V - 1));
  // the context, with the MTP cache filled alongside (a request prefilling it with speculation on)
  if (opt.progress) fmt::print(stderr, "bench: spec {} at context {}: filling...\n", opt.spec, C);
  Session s(engine, C + n + 64);
  {
    std::vector<int32_t> fill(static_cast<size_t>(C));
    for (auto& x : fill) x = d(rng);
    SpecParams sp = base;
    sp.depth = 1;
    run_one(engine, s, fill, 2, sp, nullptr, nullptr);
  }
  const Snapshot at = s.snapshot();
  const std::vector<int32_t> first = {d(rng)};
  // pass 1: plain greedy decoding, the baseline and the continuation
  std::vector<int32_t> truth;
  std::vector<double> plain;
  for (int r = 0; r <= opt.repeats; ++r) {
    s.restore(at);
    std::vector<int32_t> got;
    const GenResult res = run_one(engine, s, first, n, SpecParams{}, nullptr, &got);
    if (r == 0) truth = got;
    else plain.push_back(rate(res));
    if (got != truth) ++sr.diverged;
  }
  sr.plain_tok_s = bench_median(plain);
  if (opt.progress) fmt::print(stderr, "bench: spec: plain decoding {:.1f} tok/s\n", sr.plain_tok_s);
  // One run of (a, depth) under `seed`, repeated until it reproduces the continuation its oracle follows.
  auto spec_run = [&](double a, int depth, RoundCosts* costs, uint64_t seed) {
    GenResult res;
    std::vector<int32_t> follow = truth;
    const int passes = reproduce_continuation(follow, [&](const std::vector<int32_t>& t) {
      SpecParams sp = base;
      sp.depth = depth;
      sp.drafter = std::make_shared<OracleDrafter>(make_drafter(base, engine.weights(), seed), t, at.tokens.size() + first.size(), a, V, seed);
      s.restore(at);
      std::vector<int32_t> got;
      res = run_one(engine, s, first, n, sp, costs, &got);
      return got;
    });
    if (passes < 0) ++sr.diverged;
    else sr.rerecorded += passes;
    return res;
  };
  // round costs per depth (one run each), and what auto picks from them
  const double a0 = opt.acceptance.empty() ? -1.0 : opt.acceptance.front();
  RoundCosts table;
  table.add_verify(0, sr.plain_tok_s > 0 ? 1e3 / sr.plain_tok_s : 0.0);
  double draft_sum = 0;
  int draft_n = 0;
  for (int k = 1; k <= 6; ++k) {
    RoundCosts c;
    spec_run(a0, k, &c, opt.seed + uint64_t(k));
    if (c.measured(k)) table.add_verify(k, c.verify_ms(k));
    if (c.draft_ms() > 0) {
      draft_sum += c.draft_ms();
      ++draft_n;
    }
  }
  if (draft_n > 0) table.add_draft(draft_sum / draft_n);
  const bool mtp = base.mode == SpecMode::Mtp;
  const auto rt = table.round_ms(6, mtp);
  for (int k = 0; k <= 6; ++k) sr.costs.push_back({k, table.verify_ms(k), mtp && k > 0 ? table.draft_ms() : 0.0, rt[size_t(k)]});
  for (double a : {0.5, 0.7, 0.86, 0.95}) sr.auto_picks.push_back({a, DepthPlanner::best_depth(rt, std::vector<double>{a}, 6)});
  // the asked-for acceptances and depths
  const std::vector<double> accs = opt.acceptance.empty() ? std::vector<double>{-1.0} : opt.acceptance;
  for (double a : accs)
    for (int depth : opt.spec_depth) {
      SpecRow row;
      row.acceptance = a;
      row.depth = depth;
      std::vector<double> tps, tpr, acc, md;
      RoundCosts c;  // one loop's costs across the row's runs, as a server's loop keeps them (auto starts warm)
      for (int r = 0; r <= opt.repeats; ++r) {
        const GenResult res = spec_run(a, depth, &c, opt.seed + 100 + uint64_t(r));
        if (r == 0) continue;  // warm-up
        tps.push_back(rate(res));
        tpr.push_back(res.spec.tokens_per_round());
        acc.push_back(res.spec.acceptance());
        md.push_back(res.spec.mean_depth());
      }
      row.tok_s = bench_median(tps);
      row.speedup = sr.plain_tok_s > 0 ? row.tok_s / sr.plain_tok_s : 0.0;
      row.tokens_per_round = bench_median(tpr);
      row.accepted = bench_median(acc);
      row.mean_depth = bench_median(md);
      if (opt.progress)
        fmt::print(stderr, "bench: spec {} acceptance {} depth {}: {:.1f} tok/s ({:.2f}x), {:.2f} tokens per round\n", opt.spec,
                   a < 0 ? std::string("own") : fmt::format("{:.2f}", a), depth ? std::to_string(depth) : "auto", row.tok_s,
                   row.speedup, row.tokens_per_round);
      sr.rows.push_back(row);
    }
  rep.spec = std::move(sr);
}

nlohmann::json spec_json(const SpecReport& r) {
  nlohmann::json rows = nlohmann::json::array(), costs = nlohmann::json::array(), picks = nlohmann::json::array();
  for (const SpecRow& x : r.rows)
    rows.push_back({{"acceptance", x.acceptance < 0 ? nlohmann::json() : nlohmann::json(x.acceptance)},
                    {"depth", x.depth ? nlohmann::json(x.depth) : nlohmann::json("auto")},
                    {"tok_s", x.tok_s},
                    {"speedup", x.speedup},
                    {"tokens_per_round", x.tokens_per_round},
                    {"accepted", x.accepted},
                    {"mean_depth", x.mean_depth}});
  for (const SpecCostRow& c : r.costs)
    costs.push_back({{"k", c.k}, {"verify_ms", c.verify_ms}, {"draft_step_ms", c.draft_ms}, {"round_ms", c.round_ms}});
  for (auto [a, k] : r.auto_picks) picks.push_back({{"acceptance", a}, {"depth", k}});
  return {{"mode", r.mode},          {"context", r.context},      {"plain_tok_s", r.plain_tok_s}, {"rows", rows},
          {"round_costs", costs},    {"auto_picks", picks},       {"rerecorded_passes", r.rerecorded}, {"diverged_runs", r.diverged},
          {"draft_vocab", r.draft_vocab}};
}

std::string spec_table(const SpecReport& r) {
  std::string s = fmt::format("spec {} at context {}{}: plain decoding {:.1f} tok/s\n", r.mode, r.context,
                              r.draft_vocab ? fmt::format(", drafts from ids < {}", r.draft_vocab) : "", r.plain_tok_s);
  s += fmt::format("{:>10} {:>6} {:>10} {:>8} {:>16} {:>9} {:>7}\n", "acceptance", "depth", "tok/s", "speedup",
                   "tokens/round", "accepted", "drafts");
  for (const SpecRow& x : r.rows)
    s += fmt::format("{:>10} {:>6} {:>10.1f} {:>7.2f}x {:>16.2f} {:>8.1f}% {:>7.2f}\n",
                     x.acceptance < 0 ? std::string("own") : fmt::format("{:.2f}", x.acceptance),
                     x.depth ? std::to_string(x.depth) : "auto", x.tok_s, x.speedup, x.tokens_per_round, 100 * x.accepted,
                     x.mean_depth);
  s += "round cost by depth (verification step + MTP chain steps):\n";
  for (const SpecCostRow& c : r.costs)
    s += fmt::format("  k {}: verify {:.3f} ms, draft {:.3f} ms, round {:.3f} ms ({:.2f}x a plain step)\n", c.k, c.verify_ms,
                     c.draft_ms * c.k, c.round_ms, r.costs.front().round_ms > 0 ? c.round_ms / r.costs.front().round_ms : 0.0);
  s += "auto picks:";
  for (auto [a, k] : r.auto_picks) s += fmt::format(" {:.2f} -> {}", a, k);
  s += "\n";
  if (r.rerecorded > 0)
    s += fmt::format("{} passes repeated a run that left the plain continuation (a near-tie decided by row-count "
                     "dependent arithmetic) with its own output as the oracle's continuation\n", r.rerecorded);
  if (r.diverged > 0)
    s += fmt::format("warning: {} runs did not reproduce their continuation in {} passes: their rows undercount "
                     "the acceptance\n", r.diverged, kMaxOraclePasses);
  return s;
}

}  // namespace lily
