// Engine: one loaded model on one backend. Sessions (runtime/session.h) run sequences on it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/weights.h"

namespace lily {

struct EngineOptions {
  std::string backend = "cpu";  // "cpu" or "cuda"
  int64_t ctx_size = 32768;     // default KV capacity of a session
  int64_t prefill_chunk = 0;    // prompt tokens per forward step; 0: Backend::preferred_prefill_chunk()
  // --devices (backend/rank_driver.h parse_devices): "" one device; "N" the model split over N ranks
  // (model/shard.h): N CPU ranks run in turn, or GPUs 0..N-1; "a,b,..." the GPUs of the ranks.
  std::string devices = {};
};

class Engine {
 public:
  // Loads DIR and builds the backend. Throws InputError for bad files or an unavailable backend.
  static std::unique_ptr<Engine> open(const std::string& model_dir, const EngineOptions& opt);
  static std::unique_ptr<Engine> from_weights(std::shared_ptr<const ModelWeights> w, const EngineOptions& opt);
  // An engine over a backend the caller built for these weights (opt.backend is not read).
  static std::unique_ptr<Engine> from_backend(std::shared_ptr<const ModelWeights> w, std::unique_ptr<Backend> backend,
                                              const EngineOptions& opt);

  const ModelConfig& config() const { return weights_->cfg; }
  const ModelWeights& weights() const { return *weights_; }
  std::shared_ptr<const ModelWeights> weights_ptr() const { return weights_; }
  Backend& backend() { return *backend_; }
  const EngineOptions& options() const { return opt_; }

 private:
  std::shared_ptr<const ModelWeights> weights_;
  std::unique_ptr<Backend> backend_;
  EngineOptions opt_;
};

// Backends compiled into this binary ("cpu", and "cuda" when built with nvcc and a GPU is present).
bool backend_available(const std::string& name);

}  // namespace lily
