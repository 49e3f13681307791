#include "tools/grammar_bench.h"

#include <algorithm>
#include <chrono>
#include <bit>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/grammar_constraint.h"
#include "text/json_grammar.h"
#include "text/tokenizer.h"

namespace lily {

namespace {

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

}  // namespace

GrammarBenchReport run_grammar_bench(const GrammarBenchOptions& o) {
  GrammarBenchReport r;
  auto tok = text::Tokenizer::load(o.tokenizer_dir);
  double t0 = now_us();
  auto vocab = text::TokenVocabulary::from_tokenizer(*tok, tok->vocab_size());
  r.vocab_ms = (now_us() - t0) / 1e3;
  r.vocab = vocab->size();
  r.trie_nodes = vocab->trie_nodes();
  t0 = now_us();
  text::Grammar g = o.schema.is_null() ? text::json_object_grammar() : text::json_schema_grammar(o.schema, "--grammar");
  auto tg = std::make_shared<text::TokenGrammar>(g, vocab, tok->stop_ids());
  r.compile_ms = (now_us() - t0) / 1e3;
  std::mt19937_64 rng(o.seed);
  std::vector<double> cold, warm, acc;
  for (int d = 0; d < o.warmup + o.documents; ++d) {
    const bool timed = d >= o.warmup;
    GrammarConstraint c(tg, o.max_tokens);
    for (int64_t i = 0; i < o.max_tokens; ++i) {
      const uint64_t misses = tg->stats().misses;
      double a = now_us();
      auto m = c.allowed();
      double b = now_us();
      if (timed) warm.push_back(b - a);
      else if (tg->stats().misses > misses) cold.push_back(b - a);
      // a uniform draw among the allowed ids
      int64_t n = 0;
      for (uint64_t w : m) n += std::popcount(w);
      if (n == 0) break;
      int64_t k = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
      int32_t t = -1;
      for (size_t w = 0; w < m.size() && t < 0; ++w) {
        int64_t pc = std::popcount(m[w]);
        if (k >= pc) {
          k -= pc;
          continue;
        }
        uint64_t bits = m[w];
        for (; k > 0; --k) bits &= bits - 1;
        t = int32_t(w * 64 + size_t(std::countr_zero(bits)));
      }
      a = now_us();
      c.accept(t);
      b = now_us();
      if (timed) acc.push_back(b - a);
      ++r.steps;
      if (tg->is_end(t)) break;
    }
    if (timed) {
      ++r.documents;
      r.documents_complete += c.accepting();
    }
  }
  auto s = tg->stats();
  r.states = s.states;
  r.masks = s.masks;
  r.mask_bytes = s.mask_bytes;
  r.cold_masks = int64_t(cold.size());
  r.cold_median_us = quantile(cold, 0.5);
  r.cold_p99_us = quantile(cold, 0.99);
  r.mask_median_us = quantile(warm, 0.5);
  r.mask_p99_us = quantile(warm, 0.99);
  r.accept_median_us = quantile(acc, 0.5);
  r.accept_p99_us = quantile(acc, 0.99);
  return r;
}

nlohmann::ordered_json GrammarBenchReport::to_json() const {
  return {{"vocab", vocab}, {"trie_nodes", trie_nodes}, {"vocab_ms", vocab_ms}, {"compile_ms", compile_ms},
          {"states", states}, {"masks", masks}, {"mask_bytes", mask_bytes}, {"steps", steps},
          {"documents", documents}, {"documents_complete", documents_complete}, {"cold_masks", cold_masks},
          {"cold_median_us", cold_median_us}, {"cold_p99_us", cold_p99_us}, {"mask_median_us", mask_median_us},
          {"mask_p99_us", mask_p99_us}, {"accept_median_us", accept_median_us}, {"accept_p99_us", accept_p99_us}};
}

std::string GrammarBenchReport::table() const {
  return fmt::format(
      "vocabulary {} ids, trie {} nodes (built in {:.1f} ms), grammar compiled in {:.1f} ms\n"
      "automaton states {}, cached masks {} ({:.1f} MiB)\n"
      "cold masks (first computation, warm-up): {}  median {:.1f} us  p99 {:.1f} us\n"
      "mask per token after warm-up:            median {:.2f} us  p99 {:.2f} us\n"
      "advance per token after warm-up:         median {:.2f} us  p99 {:.2f} us\n"
      "timed documents complete: {}/{} ({} steps in all)\n",
      vocab, trie_nodes, vocab_ms, compile_ms, states, masks, double(mask_bytes) / double(1 << 20), cold_masks,
      cold_median_us, cold_p99_us, mask_median_us, mask_p99_us, accept_median_us, accept_p99_us, documents_complete,
      documents, steps);
}

}  // namespace lily
