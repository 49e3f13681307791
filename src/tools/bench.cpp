#include "tools/bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include <unistd.h>

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"

namespace lily {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes of recurrent + conv state one token's step writes back (fp32 state, fp32 conv window).
double recurrent_state_bytes(const ModelConfig& c) {
  double per_layer = double(c.lin_v_heads * c.lin_k_dim * c.lin_v_dim) * 4 + double((c.conv_kernel - 1) * c.conv_channels()) * 4;
  return per_layer * double(c.n_linear_layers());
}

}  // namespace

double bench_median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int64_t> parse_sizes(const std::string& s, const std::string& what) {
  std::vector<int64_t> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    int64_t mult = 1;
    if (!tok.empty() && (tok.back() == 'k' || tok.back() == 'K')) { mult = 1024; tok.pop_back(); }
    char* end = nullptr;
    long long x = std::strtoll(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || x <= 0) fail("{}: '{}' is not a positive size (e.g. 256,1k,4096)", what, s.substr(i, j - i));
    v.push_back(int64_t(x) * mult);
    i = j + 1;
  }
  if (v.empty()) fail("{}: empty list", what);
  return v;
}

double host_copy_bandwidth(size_t bytes, int iters) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 0);
  auto& pool = ThreadPool::global();
  const int64_t chunks = pool.size() * 4;
  double best = 0;
  for (int it = 0; it < iters; ++it) {
    double t0 = now_s();
    pool.parallel_for(chunks, 1, [&](int64_t s, int64_t e) {
      size_t lo = bytes * size_t(s) / size_t(chunks), hi = bytes * size_t(e) / size_t(chunks);
      std::memcpy(b.data() + lo, a.data() + lo, hi - lo);
    });
    double dt = now_s() - t0;
    best = std::max(best, 2.0 * double(bytes) / dt);
  }
  return best;
}

BenchReport run_bench(std::shared_ptr<const ModelWeights> w, const BenchOptions& opt) {
  if (opt.repeats < 1) fail("--repeats must be at least 1 (got {})", opt.repeats);
  if (opt.decode_tokens < 1) fail("--decode-tokens must be at least 1 (got {})", opt.decode_tokens);
  const auto& cfg = w->cfg;
  int64_t max_ctx = 16;
  for (auto p : opt.prefill) max_ctx = std::max(max_ctx, p + 1);
  for (auto c : opt.decode_context) max_ctx = std::max(max_ctx, c + int64_t(opt.decode_tokens + 2) * (opt.repeats + 1) + 2);
  if (!opt.streams.empty() || !opt.verify.empty() || !opt.spec.empty())
    max_ctx = std::max(max_ctx, opt.stream_context + opt.decode_tokens + 64);
  EngineOptions eo;
  eo.backend = opt.backend;
  eo.ctx_size = max_ctx;
  eo.prefill_chunk = opt.prefill_chunk;
  auto engine = opt.make_backend ? Engine::from_backend(w, opt.make_backend(w), eo) : Engine::from_weights(w, eo);
  Backend& be = engine->backend();
  Session s(*engine, max_ctx);

  BenchReport rep;
  rep.label = opt.label;
  rep.backend = be.name();
  rep.threads = ThreadPool::global().size();
  rep.weight_bytes = w->weight_bytes();
  rep.active_bytes = w->active_bytes_per_token();
  rep.bandwidth = be.copy_bandwidth();
  rep.bandwidth_source = be.name();
  if (rep.bandwidth <= 0) {
    rep.bandwidth = host_copy_bandwidth();
    rep.bandwidth_source = "host memcpy";
  }
  if (opt.progress)
    fmt::print(stderr, "bench: {} on {} ({} threads), {:.2f} GB weights, {:.1f} MB active per token, copy bandwidth {:.1f} GB/s ({})\n",
               opt.label, rep.backend, rep.threads, double(rep.weight_bytes) / 1e9, double(rep.active_bytes) / 1e6,
               rep.bandwidth / 1e9, rep.bandwidth_source);

  std::mt19937_64 rng(opt.seed);
  const int64_t V = cfg.vocab;
  auto random_ids = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    std::uniform_int_distribution<int32_t> d(0, int32_t(std::min<int64_t>(V, 1 << 30) - 1));
    for (auto& x : v) x = d(rng);
    return v;
  };
  std::vector<float> logits(static_cast<size_t>(V));
  const double rec = recurrent_state_bytes(cfg);

  for (int64_t P : opt.prefill) {
    BenchRow row;
    row.n = P;
    size_t state_bytes = 0;
    for (int r = 0; r <= opt.repeats; ++r) {
      s.reset();
      auto ids = random_ids(P);
      be.synchronize();
      double t0 = now_s();
      s.prefill(ids, logits.data());
      be.synchronize();
      double dt = now_s() - t0;
      if (r == 0) state_bytes = s.snapshot().nbytes();  // a deep copy: once per row
      if (r > 0) row.runs.push_back(double(P) / dt);
      if (opt.progress)
        fmt::print(stderr, "bench: prefill {:>6}: {} {:.1f} tok/s\n", P, r ? "run    " : "warm-up", double(P) / dt);
    }
    row.tok_s = bench_median(row.runs);
    const int64_t chunk = engine->options().prefill_chunk;
    const double chunks = double((P + chunk - 1) / chunk);
    row.bytes_per_token = double(rep.weight_bytes) * chunks / double(P) + double(state_bytes) / double(P) + rec * chunks / double(P);
    row.roofline_tok_s = rep.bandwidth / row.bytes_per_token;
    rep.prefill.push_back(row);
  }

  for (int64_t C : opt.decode_context) {
    BenchRow row;
    row.n = C;
    s.reset();
    if (opt.progress) fmt::print(stderr, "bench: decode @{}: filling the context...\n", C);
    auto fill = random_ids(C);
    s.prefill(fill, logits.data());
    be.synchronize();
    const size_t state_bytes = s.snapshot().nbytes();
    // Each run: the generation loop from one fresh token, greedy with no stop ids, decode_tokens + 1 tokens;
    // timed from the first emitted token to the last (the serving path: device sampling and pipelined
    // graph replays where the backend has them, host logits otherwise).
    rep.decode_path = be.can_sample() ? "device sampling, pipelined steps" : "host logits per step";
    for (int r = 0; r <= opt.repeats; ++r) {
      GenerateOptions go;
      go.max_tokens = opt.decode_tokens + 1;
      const auto first = random_ids(1);
      const GenerateResult res = generate(s, first, go);
      if (int64_t(res.tokens.size()) != opt.decode_tokens + 1)
        fail("bench: decode produced {} of {} tokens ({})", res.tokens.size(), opt.decode_tokens + 1, res.finish_reason);
      const double dt = res.decode_seconds;
      if (r > 0) row.runs.push_back(opt.decode_tokens / dt);
      if (opt.progress)
        fmt::print(stderr, "bench: decode @{:>6}: {} {:.1f} tok/s\n", C, r ? "run    " : "warm-up", opt.decode_tokens / dt);
    }
    if (opt.after_decode) opt.after_decode(be, C);
    row.tok_s = bench_median(row.runs);
    row.bytes_per_token = double(rep.active_bytes) + double(state_bytes) + rec;
    row.roofline_tok_s = rep.bandwidth / row.bytes_per_token;
    rep.decode.push_back(row);
  }
  bench_streams(*engine, opt, rep);
  bench_verify(*engine, opt, rep);
  bench_spec(*engine, opt, rep);
  rep.peak_memory = be.peak_memory();
  {
    // Resident pages now (/proc/self/statm, second field), not the high-water mark, which would count the
    // bandwidth probe's buffers.
    std::ifstream f("/proc/self/statm");
    size_t total = 0, resident = 0;
    if (f >> total >> resident) rep.resident = resident * size_t(sysconf(_SC_PAGESIZE));
  }
  return rep;
}

nlohmann::json BenchReport::to_json() const {
  auto rows = [](const std::vector<BenchRow>& v, const char* key) {
    nlohmann::json a = nlohmann::json::array();
    for (auto& r : v)
      a.push_back({{key, r.n}, {"tok_s", r.tok_s}, {"runs", r.runs}, {"bytes_per_token", r.bytes_per_token},
                   {"roofline_tok_s", r.roofline_tok_s}, {"fraction_of_roofline", r.fraction()}});
    return a;
  };
  return {{"engine", "lily"},
          {"model", label},
          {"backend", backend},
          {"threads", threads},
          {"weight_bytes", weight_bytes},
          {"active_bytes_per_token", active_bytes},
          {"peak_memory_bytes", peak_memory},
          {"resident_bytes_at_end", resident},
          {"copy_bandwidth_bytes_per_s", bandwidth},
          {"copy_bandwidth_source", bandwidth_source},
          {"decode_path", decode_path},
          {"prefill", rows(prefill, "tokens")},
          {"decode", rows(decode, "context")},
          {"streams", [&] {
             nlohmann::json a = nlohmann::json::array();
             for (auto& r : streams)
               a.push_back({{"streams", r.streams}, {"aggregate_tok_s", r.aggregate_tok_s},
                            {"per_stream_tok_s", r.per_stream_tok_s}, {"ttft_ms", r.ttft_ms}});
             return a;
           }()},
          {"verify", [&] {
             nlohmann::json a = nlohmann::json::array();
             for (auto& r : verify)
               a.push_back({{"rows", r.rows}, {"step_ms", r.step_ms}, {"one_row_ms", r.one_row_ms}, {"ratio", r.ratio()}});
             return a;
           }()},
          {"spec", spec ? spec_json(*spec) : nlohmann::json()}};
}

std::string BenchReport::table() const {
  std::string s = fmt::format("{} on {} ({} threads); weights {:.2f} GB, active {:.1f} MB/token; copy bandwidth {:.1f} GB/s ({}); peak memory {:.2f} GB (backend), {:.2f} GB resident at the end\n",
                              label, backend, threads, double(weight_bytes) / 1e9, double(active_bytes) / 1e6,
                              bandwidth / 1e9, bandwidth_source, double(peak_memory) / 1e9, double(resident) / 1e9);
  s += fmt::format("{:<10} {:>8} {:>12} {:>14} {:>16} {:>9}\n", "phase", "tokens", "tok/s", "MB/token", "roofline tok/s", "of roof");
  for (auto& r : prefill)
    s += fmt::format("{:<10} {:>8} {:>12.1f} {:>14.2f} {:>16.1f} {:>8.1f}%\n", "prefill", r.n, r.tok_s, r.bytes_per_token / 1e6,
                     r.roofline_tok_s, 100 * r.fraction());
  for (auto& r : decode)
    s += fmt::format("{:<10} {:>8} {:>12.1f} {:>14.2f} {:>16.1f} {:>8.1f}%\n", "decode@", r.n, r.tok_s, r.bytes_per_token / 1e6,
                     r.roofline_tok_s, 100 * r.fraction());
  if (!decode.empty() && !decode_path.empty()) s += fmt::format("decode steps: {}\n", decode_path);
  for (auto& r : streams)
    s += fmt::format("{:<10} {:>8} {:>12.1f} aggregate, {:.1f} per stream, first token {:.1f} ms\n", "streams", r.streams,
                     r.aggregate_tok_s, r.per_stream_tok_s, r.ttft_ms);
  for (auto& r : verify)
    s += fmt::format("{:<10} {:>8} {:>12.3f} ms per step, {:.3f} ms one row: {:.2f}x\n", "verify", r.rows, r.step_ms,
                     r.one_row_ms, r.ratio());
  if (spec) s += spec_table(*spec);
  return s;
}

}  // namespace lily
