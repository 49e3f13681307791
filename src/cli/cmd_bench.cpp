#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "backend/cpu/cpu_rank.h"
#include "cli/backend_options.h"
#include "cli/registry.h"
#include "core/error.h"
#include "runtime/spec.h"
#include "tools/bench.h"
#include "tools/bench_sampler.h"
#include "tools/grammar_bench.h"
#ifdef LILY_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "tools/synth.h"
#ifdef LILY_HAVE_CUDA
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#endif

namespace lily::cli {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return v;
}

// `--gemm`: the CUDA GEMM microbench (backend/cuda/gemm_bench.cu), at the routing of the first prompt length.
// --cuda-opt sets the kernel switches it runs under.
int run_gemm_bench(const std::string& backend, int64_t P, int repeats, bool json, const std::vector<std::string>& cuda_opts) {
  if (backend != "cuda") fail("bench --gemm needs --backend cuda (got --backend {})", backend);
  if (P < 1 || P > 65536) fail("bench --gemm: the prompt length must be in 1..65536 (got {})", P);
#ifdef LILY_HAVE_CUDA
  CudaOptions co;
  for (const auto& kv : cuda_opts) set_cuda_option(co, kv);
  const auto rows = cuda_gemm_bench(int(P), std::max(repeats, 10), co.kernels);
  nlohmann::json j = nlohmann::json::array();
  if (!json) fmt::print("{}\n\n| product | weights | kernel | ms | TFLOP/s |\n|---|---|---|---:|---:|\n", cuda_device_info());
  for (const auto& r : rows) {
    if (json)
      j.push_back({{"shape", r.shape}, {"weights", r.weights}, {"kernel", r.kernel}, {"ms", r.ms}, {"tflops", r.tflops}});
    else
      fmt::print("| {} | {} | {} | {:.3f} | {:.1f} |\n", r.shape, r.weights, r.kernel, r.ms, r.tflops);
  }
  if (json) fmt::print("{}\n", j.dump(2));
  return 0;
#else
  (void)repeats;
  (void)json;
  (void)cuda_opts;
  fail("bench --gemm: this build has no CUDA backend (configure with nvcc present)");
#endif
}

Register reg_bench("bench", "Prefill and decode speed (tok/s, fraction of the memory roofline, peak memory)", [](CLI::App& app) {
  auto model = std::make_shared<std::string>();
  auto synth = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("bf16");
  auto codebook = std::make_shared<std::string>("mcg");
  auto bits = std::make_shared<int>(4);
  auto seed = std::make_shared<uint64_t>(1);
  auto backend = std::make_shared<std::string>("cpu");
  auto prefill = std::make_shared<std::string>("256,1024");
  auto decode = std::make_shared<std::string>("256");
  auto opt = std::make_shared<BenchOptions>();
  auto json = std::make_shared<bool>(false);
  auto cuda_opts = std::make_shared<std::vector<std::string>>();
  auto devices = std::make_shared<std::string>();
  auto cuda_ab = std::make_shared<std::string>();
  auto streams = std::make_shared<std::string>();
  auto verify = std::make_shared<std::string>();
  auto sampler = std::make_shared<bool>(false);
  auto vocab = std::make_shared<std::string>("151936,248320");
  app.add_option("--model", *model, "Model directory");
  app.add_option("--synth", *synth, "Build a random model of this preset in memory instead (" + synth_preset_list() + ")");
  app.add_option("--format", *format, "With --synth: bf16 | affine4 | affine8 | exl3");
  app.add_option("--bits", *bits, "With --synth --format exl3: K");
  app.add_option("--codebook", *codebook, "With --synth --format exl3: mcg | mul1 | 3inst");
  app.add_option("--seed", *seed, "With --synth: random seed");
  app.add_option("--backend", *backend, "cpu | cuda");
  add_cuda_opt(app, *cuda_opts);
  add_devices_opt(app, *devices);
  app.add_option("--cuda-ab", *cuda_ab, "Run the bench once per set of CUDA options on the same weights (one synth): sets "
                 "separated by ';', options within a set by spaces, each name=value as --cuda-opt, after the --cuda-opt "
                 "ones (e.g. 'precision=high;precision=fp16 gemm_wgmma=1')");
  auto* prefill_opt = app.add_option("--prefill", *prefill, "Prompt lengths, comma separated (k = 1024)");
  app.add_option("--decode-context", *decode, "Context lengths for decode, comma separated (0: none)");
  app.add_option("--repeats", opt->repeats, "Timed runs per figure (median reported)");
  app.add_option("--decode-tokens", opt->decode_tokens, "Single-token steps per decode run");
  app.add_option("--prefill-chunk", opt->prefill_chunk, "Tokens per prefill step, also the context fill (0: the backend's choice, 2048 on the CPU, 8192 on CUDA)");
  app.add_option("--streams", *streams, "Also decode with this many concurrent streams in one loop, comma separated (e.g. 1,2,4,8,16,32)");
  app.add_option("--stream-context", opt->stream_context, "Context length of each stream (--streams) and of the verification steps (--verify)");
  app.add_option("--verify", *verify, "Also time tentative verification steps of these row counts against a one-row step (e.g. 2,4,8)");
  auto spec = std::make_shared<std::string>();
  auto acceptance = std::make_shared<std::string>();
  auto spec_depth = std::make_shared<std::string>("auto");
  app.add_option("--spec", *spec, "Also decode speculatively at --stream-context: mtp | ngram (a plain pass first, the baseline)");
  app.add_option("--acceptance", *acceptance, "With --spec: each drafted token is replaced by the plain continuation's with "
                 "this probability (comma separated list; default: the drafter's own drafts)");
  app.add_option("--spec-depth", *spec_depth, "With --spec: drafted tokens per round, comma separated, each 1..16 or auto")
      ->capture_default_str();
  app.add_option("--spec-vocab", opt->spec_vocab, "With --spec mtp: drafts from the first N token ids only (0: every id)");
  app.add_flag("--json", *json, "Print JSON on stdout");
  auto gemm = std::make_shared<bool>(false);
  app.add_flag("--gemm", *gemm, "Instead of a model: the prompt GEMMs alone on --backend cuda (expert products at the "
               "routing of the first --prefill length, default 4096, and a dense 8192^3 bf16 product), TFLOP/s per kernel "
               "and precision (the wgmma kernels' rows unless --cuda-opt gemm_wgmma=0)");
  auto grammar = std::make_shared<std::string>();
  auto tokenizer = std::make_shared<std::string>();
  auto gopt = std::make_shared<GrammarBenchOptions>();
  app.add_option("--grammar", *grammar, "Instead of a model: the structured-output mask cost of this JSON schema file "
                 "('json_object': any object) on --tokenizer's vocabulary");
  app.add_option("--tokenizer", *tokenizer, "With --grammar: tokenizer directory (tokenizer.json)");
  app.add_option("--documents", gopt->documents, "With --grammar: timed documents");
  app.add_option("--warmup", gopt->warmup, "With --grammar: documents that fill the mask cache first");
  app.add_option("--max-tokens", gopt->max_tokens, "With --grammar: token budget per document");
  app.add_flag("--sampler", *sampler, "Instead: host sampler time per token against the full sort (one core)");
  app.add_option("--vocab", *vocab, "With --sampler: vocabulary sizes, comma separated");
  return [=]() -> int {
    if (*sampler) {
      SamplerBenchOptions so;
      so.vocab = parse_sizes(*vocab, "--vocab");
      auto rows = run_sampler_bench(so);
      if (*json) fmt::print("{}\n", sampler_bench_json(rows).dump(2));
      else fmt::print("{}", sampler_bench_table(rows));
      return 0;
    }
    if (!grammar->empty()) {
      if (tokenizer->empty()) fail("bench: --grammar needs --tokenizer DIR");
      GrammarBenchOptions g = *gopt;
      g.tokenizer_dir = *tokenizer;
      g.seed = *seed;
      if (*grammar != "json_object") {
        std::ifstream f(*grammar);
        if (!f) fail("bench: cannot read --grammar file {}", *grammar);
        std::stringstream ss;
        ss << f.rdbuf();
        try {
          g.schema = nlohmann::ordered_json::parse(ss.str());
        } catch (const std::exception& e) {
          fail("bench: --grammar file {} is not JSON: {}", *grammar, e.what());
        }
      }
      auto rep = run_grammar_bench(g);
      if (*json) fmt::print("{}\n", rep.to_json().dump(2));
      else fmt::print("{}", rep.table());
      return 0;
    }
    if (*gemm)
      return run_gemm_bench(*backend, prefill_opt->count() ? parse_sizes(*prefill, "--prefill").front() : 4096,
                            opt->repeats, *json, *cuda_opts);
    if (model->empty() == synth->empty()) fail("bench: give exactly one of --model DIR or --synth PRESET");
    BenchOptions o = *opt;
    o.backend = *backend;
    if (!cuda_opts->empty() || (!devices->empty() && *backend == "cuda")) {
      require_cuda_backend(*cuda_opts, *backend);
#ifdef LILY_HAVE_CUDA
      // the step kernel's timeline of the last decode step (--cuda-opt mk_trace=1; one GPU)
      o.after_decode = [](Backend& be, int64_t ctx) {
        if (be.name() != "cuda") return;
        for (const std::string& line : cuda_mk_info(be).trace) fmt::print(stderr, "bench: decode @{}: {}\n", ctx, line);
      };
#endif
      o.make_backend = [opts = *cuda_opts, d = *devices](std::shared_ptr<const ModelWeights> w) {
        return make_backend_with(std::move(w), opts, d);
      };
    } else if (!devices->empty()) {
      o.make_backend = [d = *devices](std::shared_ptr<const ModelWeights> w) { return cpu::make_cpu_backend(std::move(w), d); };
    }
    o.prefill = parse_sizes(*prefill, "--prefill");
    if (*decode != "0") o.decode_context = parse_sizes(*decode, "--decode-context");  // 0: prefill only
    else o.decode_context.clear();
    if (!streams->empty()) o.streams = parse_sizes(*streams, "--streams");
    if (!verify->empty()) o.verify = parse_sizes(*verify, "--verify");
    if (o.stream_context < 1) fail("--stream-context must be positive (got {})", o.stream_context);
    if (!spec->empty()) {
      if (parse_spec_mode(*spec, "--spec") == SpecMode::Off) fail("bench: --spec off asks for nothing (mtp or ngram)");
      o.spec = *spec;
      o.spec_depth.clear();
      for (const std::string& t : split_list(*spec_depth)) o.spec_depth.push_back(parse_spec_depth(t, "--spec-depth"));
      if (o.spec_depth.empty()) fail("--spec-depth: empty list");
      for (const std::string& t : split_list(*acceptance)) {
        char* end = nullptr;
        const double a = std::strtod(t.c_str(), &end);
        if (t.empty() || *end || !(a >= 0.0 && a <= 1.0)) fail("--acceptance: '{}' is not a probability in [0, 1]", t);
        o.acceptance.push_back(a);
      }
    } else if (!acceptance->empty()) {
      fail("bench: --acceptance needs --spec mtp|ngram");
    }
    if (o.spec_vocab != 0 && (o.spec.empty() || parse_spec_mode(o.spec, "--spec") != SpecMode::Mtp))
      fail("bench: --spec-vocab needs --spec mtp");
    if (o.spec_vocab != 0 && o.spec_vocab < kMinDraftVocab)
      fail("--spec-vocab must be 0 (every id) or at least {} (got {})", kMinDraftVocab, o.spec_vocab);
    std::shared_ptr<const ModelWeights> w;
    if (!synth->empty()) {
      SynthOptions so;
      so.preset = *synth;
      so.format = parse_synth_format(*format);
      so.exl3_bits = *bits;
      so.codebook = parse_codebook(*codebook);
      so.seed = *seed;
      so.progress = true;
      // split over GPUs: each rank's share drawn on its GPU (a 397B-A17B in 4-bit does not fit host memory)
      so.shapes_only = !devices->empty() && *backend == "cuda";
      o.label = fmt::format("synth {} {}", *synth, *format);
      w = synth_model(so);
    } else {
      o.label = *model;
      w = ModelWeights::load(*model);
    }
    if (!o.spec.empty() && parse_spec_mode(o.spec, "--spec") == SpecMode::Mtp) w->require_mtp();
    if (cuda_ab->empty()) {
      auto rep = run_bench(w, o);
      if (*json) fmt::print("{}\n", rep.to_json().dump(2));
      else fmt::print("{}", rep.table());
      return 0;
    }
    std::vector<std::vector<std::string>> sets;
    for (size_t i = 0; i <= cuda_ab->size();) {
      const size_t j = std::min(cuda_ab->find(';', i), cuda_ab->size());
      std::istringstream words(cuda_ab->substr(i, j - i));
      std::vector<std::string> set = *cuda_opts;
      for (std::string kv; words >> kv;) set.push_back(kv);
      sets.push_back(set);
      i = j + 1;
    }
    if (*backend != "cuda") fail("bench: --cuda-ab needs --backend cuda (got --backend {})", *backend);
    nlohmann::json all = nlohmann::json::array();
    for (const auto& set : sets) {
      BenchOptions oi = o;
      std::string tag;
      for (size_t k = cuda_opts->size(); k < set.size(); ++k) tag += (tag.empty() ? "" : " ") + set[k];
      oi.label = fmt::format("{} [{}]", o.label, tag.empty() ? "defaults" : tag);
      oi.make_backend = [set, d = *devices](std::shared_ptr<const ModelWeights> m) { return make_backend_with(std::move(m), set, d); };
      auto rep = run_bench(w, oi);
      if (*json) all.push_back(rep.to_json());
      else fmt::print("{}\n", rep.table());
    }
    if (*json) fmt::print("{}\n", all.dump(2));
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
