#include "tools/bench_sampler.h"

#include <time.h>

#include <algorithm>
#include <random>

#include <fmt/format.h>

#include "runtime/sampler.h"
#include "runtime/sampler_reference.h"

namespace lily {

namespace {

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

std::vector<float> logits(int64_t V, bool peaked) {
  std::mt19937 g{uint32_t(V)};
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> l(static_cast<size_t>(V));
  for (auto& x : l) x = (peaked ? 2.5f : 0.02f) * n(g);
  if (peaked)
    for (int i = 0; i < 8; ++i) l[size_t((int64_t(i) * 7919) % V)] = 12.0f + 2.0f * float(i % 3);
  return l;
}

template <typename S>
double per_token_ms(S& s, const std::vector<float>& l, int tokens, int repeats) {
  std::vector<double> runs;
  volatile int32_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = thread_cpu_s();
    for (int i = 0; i < tokens; ++i) sink = sink + s.sample(l);
    runs.push_back((thread_cpu_s() - t0) / tokens * 1e3);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace

std::vector<SamplerBenchRow> run_sampler_bench(const SamplerBenchOptions& o) {
  struct P {
    const char* name;
    float t, top_p, min_p;
    int top_k;
  };
  const P params[] = {{"temperature 1", 1.0f, 1.0f, 0.0f, 0},
                      {"T 0.7, top_p 0.95", 0.7f, 0.95f, 0.0f, 0},
                      {"T 1, min_p 0.05", 1.0f, 1.0f, 0.05f, 0},
                      {"T 0.8, top_k 40, top_p 0.9", 0.8f, 0.9f, 0.0f, 40}};
  std::vector<SamplerBenchRow> rows;
  for (int64_t V : o.vocab)
    for (bool peaked : {true, false}) {
      const auto l = logits(V, peaked);
      for (const P& p : params) {
        SamplingParams sp;
        sp.temperature = p.t;
        sp.top_p = p.top_p;
        sp.min_p = p.min_p;
        sp.top_k = p.top_k;
        sp.seed = 1;
        SamplerBenchRow row{V, peaked ? "peaked" : "flat", p.name};
        Sampler fast(sp);
        row.fast_ms = per_token_ms(fast, l, o.tokens, o.repeats);
        if (o.reference) {
          ReferenceSampler ref(sp);
          row.reference_ms = per_token_ms(ref, l, std::max(1, o.tokens / 10), o.repeats);
        }
        rows.push_back(row);
      }
    }
  return rows;
}

std::string sampler_bench_table(const std::vector<SamplerBenchRow>& rows) {
  std::string s = fmt::format("{:>8}  {:<7} {:<28} {:>12} {:>16}\n", "vocab", "logits", "parameters", "ms/token", "full sort ms");
  for (auto& r : rows)
    s += fmt::format("{:>8}  {:<7} {:<28} {:>12.3f} {:>16.3f}\n", r.vocab, r.shape, r.params, r.fast_ms, r.reference_ms);
  return s;
}

nlohmann::json sampler_bench_json(const std::vector<SamplerBenchRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (auto& r : rows)
    j.push_back({{"vocab", r.vocab}, {"logits", r.shape}, {"params", r.params}, {"ms_per_token", r.fast_ms},
                 {"full_sort_ms_per_token", r.reference_ms}});
  return j;
}

}  // namespace lily
