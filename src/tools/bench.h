// `lily bench`: prefill and decode speed of one model on one backend, with roofline fractions.
//   prefill P: a fresh sequence absorbs P random token ids (in EngineOptions::prefill_chunk steps);
//              one warm-up run, then `repeats` timed runs, median tok/s.
//   decode @C: the sequence is filled to C tokens with random ids in big prefill chunks (the cheap fill),
//              one warm-up step, then `repeats` timings of `decode_tokens` single-token steps, median
//              tok/s (the context grows by decode_tokens per repeat).
// Timings are taken after Backend::synchronize(). The roofline of a figure is the measured copy bandwidth
// divided by the bytes that must move per token:
//   decode:  active weights (top-k experts, lm_head, one embedding row) + the sequence state read
//            (KV cache + conv + recurrent state) + the recurrent and conv state written back;
//   prefill: every weight once per prefill chunk, shared by the chunk's tokens, + the same state traffic.
// Copy bandwidth: Backend::copy_bandwidth() when the backend measures its own memory, else a threaded host
// memcpy of a large buffer (bytes read + bytes written per second, best of several).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/request.h"

namespace lily {

struct BenchOptions {
  std::string backend = "cpu";
  std::vector<int64_t> prefill = {256, 1024};
  std::vector<int64_t> decode_context = {256};
  int repeats = 3;
  int decode_tokens = 32;
  int64_t prefill_chunk = 0;  // 0: the backend's preferred size
  uint64_t seed = 1234;
  bool progress = true;  // on stderr
  std::string label;     // model description for the report
  // Several streams decoding together (continuous batching): for each N, N sequences at stream_context
  // tokens each decode decode_tokens tokens in one generation loop; aggregate and per-stream tok/s.
  std::vector<int64_t> streams;
  int64_t stream_context = 4096;
  // Verification steps: a tentative step of k rows of one sequence at stream_context, timed against a
  // one-row step (both with outputs for every row, rolled back), for each k.
  std::vector<int64_t> verify;
  // Builds the backend instead of `backend` (e.g. CUDA with --cuda-opt options); empty: EngineOptions::backend.
  std::function<std::unique_ptr<Backend>(std::shared_ptr<const ModelWeights>)> make_backend;
  // Called after the timed runs of each decode context (e.g. to print the backend's own breakdown of a step).
  std::function<void(Backend&, int64_t context)> after_decode;
  // Speculative decoding (bench_spec.cpp) at stream_context: "mtp" or "ngram" ("": off). A first pass
  // decodes decode_tokens + 1 tokens plainly (greedy; the baseline and the known continuation); then for
  // each acceptance a and each depth (0: auto) the same tokens with speculation, each drafted token
  // replaced by the continuation's with probability a and by another token otherwise (the drafter's own
  // drafts when `acceptance` is empty). Also the round costs of k = 1..6 and the depth auto picks at
  // acceptance 0.5, 0.7, 0.86, 0.95 from them.
  std::string spec;
  std::vector<double> acceptance;
  std::vector<int> spec_depth = {0};
  int spec_vocab = 0;  // MTP drafts from ids [0, spec_vocab) only (SpecParams::draft_vocab); 0: every id
};

struct BenchRow {
  int64_t n = 0;                 // prompt length (prefill) or context length (decode)
  double tok_s = 0;              // median
  std::vector<double> runs;      // tok/s of each timed run
  double bytes_per_token = 0;
  double roofline_tok_s = 0;     // bandwidth / bytes_per_token
  double fraction() const { return roofline_tok_s > 0 ? tok_s / roofline_tok_s : 0; }
};

struct StreamRow {
  int64_t streams = 0;
  double aggregate_tok_s = 0, per_stream_tok_s = 0;
  double ttft_ms = 0;  // median time to the first token (the streams' one-token prompts)
};
struct VerifyRow {
  int64_t rows = 0;
  double step_ms = 0, one_row_ms = 0;  // medians
  double ratio() const { return one_row_ms > 0 ? step_ms / one_row_ms : 0; }
};

struct SpecRow {
  double acceptance = -1;  // asked for (-1: the drafter's own)
  int depth = 0;           // 0: auto
  double tok_s = 0, speedup = 0;           // medians; speedup over the plain pass of the same run
  double tokens_per_round = 0, accepted = 0, mean_depth = 0;  // measured
};
struct SpecCostRow {
  int k = 0;
  double verify_ms = 0, draft_ms = 0, round_ms = 0;  // verification step, one MTP chain step, T(k)
};
struct SpecReport {
  std::string mode;
  int64_t context = 0;
  int draft_vocab = 0;  // SpecParams::draft_vocab of the runs
  double plain_tok_s = 0;
  std::vector<SpecRow> rows;
  std::vector<SpecCostRow> costs;                 // k = 0..6 (0: a plain decode step)
  std::vector<std::pair<double, int>> auto_picks;  // (acceptance, depth auto picks from the costs)
  // Runs whose output left the continuation the oracle follows (a near-tie decided by row-count dependent
  // arithmetic; never on the CPU): `rerecorded` passes repeated a run with its own output as the
  // continuation; `diverged` counts runs that still differed after kMaxOraclePasses (their rows undercount
  // the acceptance) and plain repeats that differed from the first plain pass.
  int rerecorded = 0, diverged = 0;
};

constexpr int kMaxOraclePasses = 8;
// Runs `run(truth)` until it emits exactly `truth`, replacing `truth` by each pass's output. A pass given
// its predecessor's output reproduces it up to the first token the oracle's drafts could change, so each
// pass moves the difference later (for a fixed depth). Returns the passes after the first, or -1 when
// `max_passes` passes did not agree (`truth` is then the last output).
int reproduce_continuation(std::vector<int32_t>& truth, const std::function<std::vector<int32_t>(const std::vector<int32_t>&)>& run,
                           int max_passes = kMaxOraclePasses);

struct BenchReport {
  std::string label, backend;
  int threads = 0;
  size_t weight_bytes = 0, active_bytes = 0, peak_memory = 0;  // peak_memory: Backend::peak_memory()
  size_t resident = 0;           // resident set at the end of the run (weights + state; the bandwidth probe excluded)
  double bandwidth = 0;          // bytes/s
  std::string bandwidth_source;  // "host memcpy" or the backend's name
  std::string decode_path;       // how decode steps were driven (on-device sampling or host logits)
  std::vector<BenchRow> prefill, decode;
  std::vector<StreamRow> streams;
  std::vector<VerifyRow> verify;
  std::optional<SpecReport> spec;
  nlohmann::json to_json() const;
  std::string table() const;     // human-readable
};

// A request the bench runs: the tokens it emitted and its result.
class BenchJob final : public Job {
 public:
  using Job::Job;
  bool on_token(int32_t t, std::span<const float>) override {
    ids.push_back(t);
    return true;
  }
  void on_finish(const GenResult& r) override { res = r; }
  std::vector<int32_t> ids;
  GenResult res;
};

// Median (0 for none).
double bench_median(std::vector<double> v);

// Threaded host memcpy bandwidth, bytes/s (read + write), best of `iters` copies of `bytes`.
double host_copy_bandwidth(size_t bytes = size_t(256) << 20, int iters = 5);

BenchReport run_bench(std::shared_ptr<const ModelWeights> w, const BenchOptions& opt);
// The streams and verification figures of `opt` on an engine (bench_streams.cpp; run_bench calls them).
void bench_streams(Engine& engine, const BenchOptions& opt, BenchReport& rep);
void bench_verify(Engine& engine, const BenchOptions& opt, BenchReport& rep);
void bench_spec(Engine& engine, const BenchOptions& opt, BenchReport& rep);
nlohmann::json spec_json(const SpecReport& r);
std::string spec_table(const SpecReport& r);

// "256,1k,4K,32768" -> {256, 1024, 4096, 32768}; throws InputError naming `what`.
std::vector<int64_t> parse_sizes(const std::string& s, const std::string& what);

}  // namespace lily
