#include "tools/calibrate.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "backend/cpu/matmul_observer.h"
#include "backend/cpu/mtp_reference.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "runtime/engine.h"

namespace lily {

std::vector<int32_t> read_token_file(const std::string& path) {
  const std::string s = read_text_file(path);
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || std::isspace(static_cast<unsigned char>(s[i])))) ++i;
    if (i >= s.size()) break;
    size_t j = i;
    while (j < s.size() && s[j] != ',' && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    const std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end != tok.c_str() + tok.size() || v < 0 || v > INT32_MAX)
      fail("{}: '{}' is not a token id (expected non-negative integers separated by commas or white space)", path, tok);
    ids.push_back(int32_t(v));
    i = j;
  }
  if (ids.empty()) fail("{}: no token ids", path);
  return ids;
}

namespace {

struct Capture {
  std::set<std::string> wanted;
  std::map<std::string, std::vector<double>> H;
  std::map<std::string, int64_t> rows;
};

void observe(void* ctx, const Linear& W, const float* x, int64_t T) {
  auto& c = *static_cast<Capture*>(ctx);
  if (!c.wanted.count(W.name)) return;
  const int64_t n = W.in;
  auto& H = c.H[W.name];
  if (H.empty()) H.assign(static_cast<size_t>(n * n), 0.0);
  if (int64_t(H.size()) != n * n) return;  // same name, other width: not a linear we quantize
  for (int64_t t = 0; t < T; ++t) {
    const float* r = x + t * n;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = r[i];
      if (xi == 0) continue;
      double* h = H.data() + i * n;
      for (int64_t j = 0; j < n; ++j) h[j] += xi * r[j];
    }
  }
  c.rows[W.name] += T;
}

}  // namespace

std::map<std::string, std::vector<double>> capture_hessians(const std::string& model_dir, const std::string& tokens_file,
                                                            int64_t max_tokens, const std::vector<std::string>& names) {
  auto ids = read_token_file(tokens_file);
  if (int64_t(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
  EngineOptions eo;
  eo.backend = "cpu";
  eo.ctx_size = int64_t(ids.size()) + 1;
  auto engine = Engine::open(model_dir, eo);
  for (int32_t t : ids)
    if (t >= engine->config().vocab)
      fail("{}: token id {} is outside the vocabulary [0, {})", tokens_file, t, engine->config().vocab);
  Capture cap;
  cap.wanted.insert(names.begin(), names.end());
  cpu::set_matmul_observer(observe, &cap);
  try {
    // The main model, then the MTP block (when the model has one) over the same tokens, teacher-forced.
    auto& be = dynamic_cast<cpu::CpuBackend&>(engine->backend());
    auto st = be.new_state(eo.ctx_size);
    auto h = cpu::final_hidden_states(be, *st, ids, engine->options().prefill_chunk, nullptr);
    const auto& w = engine->weights();
    std::vector<float> last(static_cast<size_t>(w.cfg.vocab));  // the head on the last row, as a prefill runs it
    cpu::matmul(w.lm_head, h.data() + (int64_t(ids.size()) - 1) * w.cfg.hidden, 1, last.data());
    if (w.mtp && ids.size() >= 2) {
      cpu::MtpReference mtp(w);
      mtp.step(std::span<const int32_t>(ids).subspan(1), h.data(), nullptr, nullptr);  // no head: lm_head sees main rows only
    }
  } catch (...) {
    cpu::set_matmul_observer(nullptr, nullptr);
    throw;
  }
  cpu::set_matmul_observer(nullptr, nullptr);
  for (auto& [name, H] : cap.H) {
    const double n = double(cap.rows[name]);
    for (auto& v : H) v /= n;
  }
  return std::move(cap.H);
}

}  // namespace lily
