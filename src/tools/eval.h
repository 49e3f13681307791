// `lily eval`: fidelity of a (quantized) model against a reference on the same token ids, teacher-forced.
// Row t's logits predict token t+1, so n tokens give n−1 scored positions:
//   ppl_*           exp(mean −log p(token t+1))
//   kl_mean, kl_p99 mean and 99th percentile over positions of KL(reference ‖ model) in nats
//   top1_agreement  fraction of positions where both argmaxes agree
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lily {

struct EvalOptions {
  std::string backend = "cpu";
  int64_t chunk = 256;  // tokens per teacher-forced step (both models advance chunk by chunk)
  std::string devices;  // EngineOptions::devices, for both models
};

struct EvalResult {
  int64_t positions = 0;
  double ppl_model = 0, ppl_reference = 0, kl_mean = 0, kl_p99 = 0, top1_agreement = 0;
};

// Per-position statistics from two logit matrices [rows, V] (row t scored against next_ids[t]; next_ids null:
// KL and top-1 agreement only, the perplexities stay unset).
struct EvalAccumulator {
  std::vector<double> kl;
  double nll_model = 0, nll_ref = 0;
  int64_t agree = 0;
  void add(const float* model, const float* ref, int64_t rows, int64_t V, const int32_t* next_ids);
  EvalResult result() const;
};

EvalResult eval_models(const std::string& model_dir, const std::string& reference_dir, const std::vector<int32_t>& ids,
                       const EvalOptions& opt = {});

}  // namespace lily
