// llama-peer: llama.cpp driven the way lily is measured, so the two can be compared on one GGUF.
//   llama-peer logits --model F.gguf --ids 1,2,3 --out logits.f32 [--threads N]
//       teacher-forced logits of the whole prompt in one batch: float32 little-endian [T, vocab], the
//       same file format as `lily logits`.
//   llama-peer mtp-logits --model F.gguf --ids 1,2,3 --out mtp.f32 [--threads N]
//       teacher-forced logits of the model's MTP block [T-1, vocab]: the main model's post-norm states
//       h_t (llama.cpp's h_nextn) for the prompt, then the MTP context over the pairs (x_{t+1}, h_t) at
//       positions t = 0..T-2 (the convention of `lily logits --mtp` and the golden MTP logits).
//   llama-peer bench --model F.gguf [--prefill 256,1024] [--decode-context 256,4096] [--repeats 3]
//                    [--decode-tokens 32] [--threads N] [--batch 2048] [--ubatch 512] [--gpu-layers N]
//       prefill tok/s per prompt length (random ids, one warm-up run, median of repeats) and decode tok/s
//       at each context length (context filled with random ids in big batches, one warm-up step, then
//       `repeats` timings of `decode-tokens` single-token steps, median). JSON on stdout, progress on stderr.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

// llama.cpp's staging API for MTP (src/llama-ext.h, C++ linkage), exported by libllama.
void llama_set_embeddings_nextn(llama_context* ctx, bool value, bool masked);
float* llama_get_embeddings_nextn(llama_context* ctx);

namespace {

struct Args {
  std::string mode, model, out, ids;
  std::vector<int> prefill{256}, decode_ctx{256};
  int repeats = 3, decode_tokens = 32, threads = 0, batch = 2048, ubatch = 512, gpu_layers = 0;
  bool verbose = false;
};

std::vector<int> parse_list(const std::string& s, const char* what) {
  std::vector<int> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    long x = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end != '\0' || x < 0) throw std::runtime_error(std::string(what) + ": bad number '" + tok + "'");
    v.push_back(int(x));
    i = j + 1;
  }
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) throw std::runtime_error("usage: llama-peer logits|bench --model F.gguf ...");
  a.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--model") a.model = val();
    else if (k == "--out") a.out = val();
    else if (k == "--ids") a.ids = val();
    else if (k == "--prefill") a.prefill = parse_list(val(), "--prefill");
    else if (k == "--decode-context") a.decode_ctx = parse_list(val(), "--decode-context");
    else if (k == "--repeats") a.repeats = std::max(1, std::atoi(val().c_str()));
    else if (k == "--decode-tokens") a.decode_tokens = std::max(1, std::atoi(val().c_str()));
    else if (k == "--threads") a.threads = std::atoi(val().c_str());
    else if (k == "--batch") a.batch = std::atoi(val().c_str());
    else if (k == "--ubatch") a.ubatch = std::atoi(val().c_str());
    else if (k == "--gpu-layers") a.gpu_layers = std::atoi(val().c_str());
    else if (k == "--verbose") a.verbose = true;
    else throw std::runtime_error("unknown option " + k);
  }
  if (a.model.empty()) throw std::runtime_error("--model is required");
  if (a.mode != "logits" && a.mode != "mtp-logits" && a.mode != "bench")
    throw std::runtime_error("mode must be logits, mtp-logits or bench");
  return a;
}

bool g_verbose = false;
void quiet_log(ggml_log_level level, const char* text, void*) {
  if (g_verbose || level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Peer {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  const llama_vocab* vocab = nullptr;
  int n_vocab = 0;
  llama_batch batch{};
  int batch_cap = 0;

  Peer(const Args& a, int n_ctx, int n_batch, int n_ubatch) {
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = a.gpu_layers;
    mp.progress_callback = [](float, void*) { return true; };  // no progress dots
    model = llama_model_load_from_file(a.model.c_str(), mp);
    if (!model) throw std::runtime_error("llama.cpp could not load " + a.model);
    vocab = llama_model_get_vocab(model);
    n_vocab = llama_vocab_n_tokens(vocab);
    auto cp = llama_context_default_params();
    cp.n_ctx = uint32_t(n_ctx);
    cp.n_batch = uint32_t(n_batch);
    cp.n_ubatch = uint32_t(n_ubatch);
    cp.n_seq_max = 1;
    cp.no_perf = true;
    if (a.threads > 0) { cp.n_threads = a.threads; cp.n_threads_batch = a.threads; }
    ctx = llama_init_from_model(model, cp);
    if (!ctx) throw std::runtime_error("llama.cpp could not create a context");
    batch_cap = n_batch;
    batch = llama_batch_init(n_batch, 0, 1);
  }
  ~Peer() {
    llama_batch_free(batch);
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
  }
  void clear() { llama_memory_clear(llama_get_memory(ctx), true); }

  // Appends tokens at positions pos0.., in chunks of the batch size; logits for every row when `all`.
  void feed(const int32_t* ids, int n, int pos0, bool all, const std::function<void(int, const float*)>* on_row = nullptr) {
    for (int s = 0; s < n; s += batch_cap) {
      int m = std::min(batch_cap, n - s);
      batch.n_tokens = m;
      for (int i = 0; i < m; ++i) {
        batch.token[i] = ids[s + i];
        batch.pos[i] = pos0 + s + i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all || (s + i == n - 1);
      }
      if (int rc = llama_decode(ctx, batch); rc != 0) throw std::runtime_error("llama_decode failed: " + std::to_string(rc));
      if (on_row)
        for (int i = 0; i < m; ++i) (*on_row)(s + i, llama_get_logits_ith(ctx, i));
    }
    llama_synchronize(ctx);
  }
};

int run_logits(const Args& a) {
  std::vector<int> ids = parse_list(a.ids, "--ids");
  if (ids.empty()) throw std::runtime_error("--ids is empty");
  if (a.out.empty()) throw std::runtime_error("--out is required");
  int T = int(ids.size());
  Peer p(a, std::max(T + 16, 256), T, T);
  std::vector<int32_t> tok(ids.begin(), ids.end());
  for (auto t : tok)
    if (t >= p.n_vocab) throw std::runtime_error("token id " + std::to_string(t) + " >= vocab " + std::to_string(p.n_vocab));
  std::vector<float> logits(size_t(T) * size_t(p.n_vocab));
  std::function<void(int, const float*)> row = [&](int i, const float* l) {
    std::memcpy(logits.data() + size_t(i) * size_t(p.n_vocab), l, size_t(p.n_vocab) * 4);
  };
  p.feed(tok.data(), T, 0, true, &row);
  FILE* f = std::fopen(a.out.c_str(), "wb");
  if (!f || std::fwrite(logits.data(), 4, logits.size(), f) != logits.size()) throw std::runtime_error("cannot write " + a.out);
  std::fclose(f);
  std::fprintf(stderr, "wrote %s [%d, %d]\n", a.out.c_str(), T, p.n_vocab);
  return 0;
}

int run_mtp_logits(const Args& a) {
  std::vector<int> ids = parse_list(a.ids, "--ids");
  if (ids.size() < 2) throw std::runtime_error("--ids needs at least 2 ids");
  if (a.out.empty()) throw std::runtime_error("--out is required");
  const int T = int(ids.size());
  auto mp = llama_model_default_params();
  mp.load_mtp = true;
  mp.progress_callback = [](float, void*) { return true; };
  llama_model* model = llama_model_load_from_file(a.model.c_str(), mp);
  if (!model) throw std::runtime_error("llama.cpp could not load " + a.model);
  if (llama_model_n_layer_nextn(model) < 1) throw std::runtime_error(a.model + " has no MTP block (nextn_predict_layers)");
  const int n_embd = llama_model_n_embd(model), V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  auto cp = llama_context_default_params();
  cp.n_ctx = uint32_t(std::max(T + 16, 256));
  cp.n_batch = cp.n_ubatch = uint32_t(T);
  cp.n_seq_max = 1;
  cp.no_perf = true;
  if (a.threads > 0) { cp.n_threads = a.threads; cp.n_threads_batch = a.threads; }
  llama_context* tgt = llama_init_from_model(model, cp);
  cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
  llama_context* dft = tgt ? llama_init_from_model(model, cp) : nullptr;
  if (!tgt || !dft) throw std::runtime_error("llama.cpp could not create the target and MTP contexts");
  llama_set_embeddings_nextn(tgt, true, /*masked=*/false);
  llama_batch b = llama_batch_init(T, 0, 1);
  for (int i = 0; i < T; ++i) {
    b.token[i] = ids[size_t(i)];
    b.pos[i] = i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = i == T - 1;
  }
  b.n_tokens = T;
  if (int rc = llama_decode(tgt, b); rc != 0) throw std::runtime_error("llama_decode (target) failed: " + std::to_string(rc));
  const float* h = llama_get_embeddings_nextn(tgt);
  if (!h) throw std::runtime_error("llama.cpp returned no h_nextn states");
  // The MTP context needs token ids and hidden rows in one batch; llama_batch_init allocates one of them.
  llama_batch m = llama_batch_init(T, n_embd, 1);
  m.token = static_cast<llama_token*>(std::malloc(sizeof(llama_token) * size_t(T)));
  for (int i = 0; i < T - 1; ++i) {
    m.token[i] = ids[size_t(i + 1)];
    std::memcpy(m.embd + size_t(i) * size_t(n_embd), h + size_t(i) * size_t(n_embd), size_t(n_embd) * 4);
    m.pos[i] = i;
    m.n_seq_id[i] = 1;
    m.seq_id[i][0] = 0;
    m.logits[i] = 1;
  }
  m.n_tokens = T - 1;
  if (int rc = llama_decode(dft, m); rc != 0) throw std::runtime_error("llama_decode (MTP) failed: " + std::to_string(rc));
  std::vector<float> logits(size_t(T - 1) * size_t(V));
  for (int i = 0; i < T - 1; ++i) std::memcpy(logits.data() + size_t(i) * size_t(V), llama_get_logits_ith(dft, i), size_t(V) * 4);
  llama_batch_free(m);
  llama_batch_free(b);
  llama_free(dft);
  llama_free(tgt);
  llama_model_free(model);
  FILE* f = std::fopen(a.out.c_str(), "wb");
  if (!f || std::fwrite(logits.data(), 4, logits.size(), f) != logits.size()) throw std::runtime_error("cannot write " + a.out);
  std::fclose(f);
  std::fprintf(stderr, "wrote %s [%d, %d]\n", a.out.c_str(), T - 1, V);
  return 0;
}

int run_bench(const Args& a) {
  int max_ctx = 0;
  for (int x : a.prefill) max_ctx = std::max(max_ctx, x);
  for (int x : a.decode_ctx) max_ctx = std::max(max_ctx, x + a.decode_tokens * (a.repeats + 1) + 1);
  Peer p(a, max_ctx + 16, a.batch, std::min(a.batch, a.ubatch));
  std::mt19937 rng(1234);
  auto random_ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    std::uniform_int_distribution<int> d(0, std::min(p.n_vocab, 32000) - 1);
    for (auto& x : v) x = d(rng);
    return v;
  };
  std::string json = "{\"engine\":\"llama.cpp\",\"model\":\"" + a.model + "\",\"threads\":" + std::to_string(a.threads) +
                     ",\"batch\":" + std::to_string(a.batch) + ",\"ubatch\":" + std::to_string(a.ubatch) + ",\"prefill\":[";
  bool first = true;
  for (int P : a.prefill) {
    std::vector<double> runs;
    for (int r = 0; r <= a.repeats; ++r) {
      auto ids = random_ids(P);
      p.clear();
      double t0 = now_s();
      p.feed(ids.data(), P, 0, false);
      double dt = now_s() - t0;
      if (r > 0) runs.push_back(P / dt);  // run 0 is the warm-up
      std::fprintf(stderr, "llama.cpp prefill %d: %s %.1f tok/s\n", P, r ? "run" : "warm-up", P / dt);
    }
    json += std::string(first ? "" : ",") + "{\"tokens\":" + std::to_string(P) + ",\"tok_s\":" + std::to_string(median(runs)) + "}";
    first = false;
  }
  json += "],\"decode\":[";
  first = true;
  for (int C : a.decode_ctx) {
    p.clear();
    auto fill = random_ids(C);
    p.feed(fill.data(), C, 0, false);
    int pos = C;
    auto step = random_ids(a.decode_tokens * (a.repeats + 1));
    std::vector<double> runs;
    size_t k = 0;
    for (int r = 0; r <= a.repeats; ++r) {
      double t0 = now_s();
      for (int i = 0; i < a.decode_tokens; ++i) p.feed(&step[k++], 1, pos++, true);
      double dt = now_s() - t0;
      if (r > 0) runs.push_back(a.decode_tokens / dt);
      std::fprintf(stderr, "llama.cpp decode @%d: %s %.1f tok/s\n", C, r ? "run" : "warm-up", a.decode_tokens / dt);
    }
    json += std::string(first ? "" : ",") + "{\"context\":" + std::to_string(C) + ",\"tok_s\":" + std::to_string(median(runs)) + "}";
    first = false;
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    g_verbose = a.verbose;
    llama_log_set(quiet_log, nullptr);
    ggml_backend_load_all_from_path(LLAMA_LIBS_DIR);
    llama_backend_init();
    int rc = a.mode == "logits" ? run_logits(a) : a.mode == "mtp-logits" ? run_mtp_logits(a) : run_bench(a);
    llama_backend_free();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama-peer: %s\n", e.what());
    return 2;
  }
}
