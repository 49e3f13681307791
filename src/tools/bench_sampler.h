// `lily bench --sampler`: host sampler time per token (one core) at given vocabulary sizes, for the
// usual parameter sets (temperature alone, top-p, min-p, top-k + top-p) on two logit shapes: peaked
// (a spread bulk, a few ids far above it, as trained models give) and flat (random weights: every id
// nearly equally likely). Each against the full-sort reference (ReferenceSampler). Time is the
// thread's CPU time, median of `repeats` runs of `tokens` draws.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily {

struct SamplerBenchOptions {
  std::vector<int64_t> vocab = {151936, 248320};
  int tokens = 200;          // draws per timed run (the reference: tokens / 10)
  int repeats = 5;
  bool reference = true;     // also time the full sort
};

struct SamplerBenchRow {
  int64_t vocab = 0;
  std::string shape, params;
  double fast_ms = 0, reference_ms = 0;  // per token
};

std::vector<SamplerBenchRow> run_sampler_bench(const SamplerBenchOptions& o);
std::string sampler_bench_table(const std::vector<SamplerBenchRow>& rows);
nlohmann::json sampler_bench_json(const std::vector<SamplerBenchRow>& rows);

}  // namespace lily
