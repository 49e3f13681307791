#include "tools/eval.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"

namespace lily {

namespace {
// log-softmax of one row (double accumulation); returns the argmax.
int64_t log_softmax(const float* x, int64_t V, std::vector<double>& out) {
  out.resize(size_t(V));
  int64_t am = 0;
  double mx = x[0];
  for (int64_t i = 1; i < V; ++i)
    if (x[i] > mx) {
      mx = x[i];
      am = i;
    }
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(s);
  for (int64_t i = 0; i < V; ++i) out[size_t(i)] = double(x[i]) - lse;
  return am;
}
}  // namespace

void EvalAccumulator::add(const float* model, const float* ref, int64_t rows, int64_t V, const int32_t* next_ids) {
  std::vector<double> lm, lr;
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t am = log_softmax(model + t * V, V, lm), ar = log_softmax(ref + t * V, V, lr);
    double k = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double p = std::exp(lr[size_t(i)]);
      if (p > 0) k += p * (lr[size_t(i)] - lm[size_t(i)]);
    }
    kl.push_back(std::max(0.0, k));
    if (next_ids) {
      nll_model -= lm[size_t(next_ids[t])];
      nll_ref -= lr[size_t(next_ids[t])];
    }
    agree += am == ar;
  }
}

EvalResult EvalAccumulator::result() const {
  EvalResult r;
  r.positions = int64_t(kl.size());
  if (kl.empty()) return r;
  const double n = double(kl.size());
  r.ppl_model = std::exp(nll_model / n);
  r.ppl_reference = std::exp(nll_ref / n);
  double s = 0;
  for (double k : kl) s += k;
  r.kl_mean = s / n;
  std::vector<double> sorted = kl;
  std::sort(sorted.begin(), sorted.end());
  // nearest-rank 99th percentile
  const size_t idx = size_t(std::ceil(0.99 * n)) - 1;
  r.kl_p99 = sorted[std::min(idx, sorted.size() - 1)];
  r.top1_agreement = double(agree) / n;
  return r;
}

EvalResult eval_models(const std::string& model_dir, const std::string& reference_dir, const std::vector<int32_t>& ids,
                       const EvalOptions& opt) {
  if (ids.size() < 2) fail("eval needs at least 2 token ids, got {}", ids.size());
  EngineOptions eo;
  eo.backend = opt.backend;
  eo.devices = opt.devices;
  eo.ctx_size = int64_t(ids.size());
  auto em = Engine::open(model_dir, eo);
  auto er = Engine::open(reference_dir, eo);
  const int64_t V = em->config().vocab;
  if (er->config().vocab != V)
    fail("{} has a vocabulary of {} but the reference {} has {}", model_dir, V, reference_dir, er->config().vocab);
  for (int32_t t : ids)
    if (t < 0 || t >= V) fail("token id {} is outside the vocabulary [0, {})", t, V);
  Session sm(*em, eo.ctx_size), sr(*er, eo.ctx_size);
  EvalAccumulator acc;
  const int64_t n = int64_t(ids.size()), chunk = std::max<int64_t>(1, opt.chunk);
  std::vector<float> lm, lr;
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t c = std::min(chunk, n - b);
    lm.resize(size_t(c * V));
    lr.resize(size_t(c * V));
    std::span<const int32_t> part(ids.data() + b, size_t(c));
    sm.prefill(part, nullptr, lm.data());
    sr.prefill(part, nullptr, lr.data());
    const int64_t rows = std::min(c, n - 1 - b);  // the last token has nothing to predict
    if (rows > 0) acc.add(lm.data(), lr.data(), rows, V, ids.data() + b + 1);
  }
  return acc.result();
}

}  // namespace lily
