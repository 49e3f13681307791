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
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/weights.h"

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
};

struct BenchRow {
  int64_t n = 0;                 // prompt length (prefill) or context length (decode)
  double tok_s = 0;              // median
  std::vector<double> runs;      // tok/s of each timed run
  double bytes_per_token = 0;
  double roofline_tok_s = 0;     // bandwidth / bytes_per_token
  double fraction() const { return roofline_tok_s > 0 ? tok_s / roofline_tok_s : 0; }
};

struct BenchReport {
  std::string label, backend;
  int threads = 0;
  size_t weight_bytes = 0, active_bytes = 0, peak_memory = 0;  // peak_memory: Backend::peak_memory()
  size_t resident = 0;           // resident set at the end of the run (weights + state; the bandwidth probe excluded)
  double bandwidth = 0;          // bytes/s
  std::string bandwidth_source;  // "host memcpy" or the backend's name
  std::string decode_path;       // how decode steps were driven (on-device sampling or host logits)
  std::vector<BenchRow> prefill, decode;
  nlohmann::json to_json() const;
  std::string table() const;     // human-readable
};

// Threaded host memcpy bandwidth, bytes/s (read + write), best of `iters` copies of `bytes`.
double host_copy_bandwidth(size_t bytes = size_t(256) << 20, int iters = 5);

BenchReport run_bench(std::shared_ptr<const ModelWeights> w, const BenchOptions& opt);

// "256,1k,4K,32768" -> {256, 1024, 4096, 32768}; throws InputError naming `what`.
std::vector<int64_t> parse_sizes(const std::string& s, const std::string& what);

}  // namespace lily
