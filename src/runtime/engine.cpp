#include "runtime/engine.h"

#include "backend/cpu/cpu_rank.h"
#include "backend/rank_driver.h"
#include "core/error.h"
#ifdef LILY_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/shard_ranks.h"
#endif

namespace lily {

bool backend_available(const std::string& name) {
  if (name == "cpu") return true;
#ifdef LILY_HAVE_CUDA
  if (name == "cuda") return cuda_available();
#endif
  return false;
}

std::unique_ptr<Engine> Engine::open(const std::string& model_dir, const EngineOptions& opt) {
  return from_weights(ModelWeights::load(model_dir), opt);
}

std::unique_ptr<Engine> Engine::from_weights(std::shared_ptr<const ModelWeights> w, const EngineOptions& opt) {
  LILY_CHECK(opt.ctx_size > 0, "--ctx-size must be positive (got {})", opt.ctx_size);
  LILY_CHECK(opt.prefill_chunk >= 0, "--prefill-chunk must be positive, or 0 for the backend's choice (got {})",
             opt.prefill_chunk);
  auto e = std::unique_ptr<Engine>(new Engine());
  e->weights_ = std::move(w);
  e->opt_ = opt;
  if (opt.backend == "cpu") {
    e->backend_ = cpu::make_cpu_backend(e->weights_, opt.devices);
  } else if (opt.backend == "cuda") {
#ifdef LILY_HAVE_CUDA
    if (!cuda_available()) fail("--backend cuda: no usable CUDA device is present");
    if (!opt.devices.empty()) e->backend_ = make_cuda_ranks(e->weights_, parse_devices(opt.devices), CudaOptions{});
    else e->backend_ = make_cuda_backend(e->weights_, CudaOptions{});
#else
    fail("--backend cuda: this build has no CUDA backend (configure with nvcc present)");
#endif
  } else {
    fail("--backend '{}' is unknown (cpu or cuda)", opt.backend);
  }
  if (e->opt_.prefill_chunk == 0) e->opt_.prefill_chunk = e->backend_->preferred_prefill_chunk();
  return e;
}

std::unique_ptr<Engine> Engine::from_backend(std::shared_ptr<const ModelWeights> w, std::unique_ptr<Backend> backend,
                                             const EngineOptions& opt) {
  LILY_CHECK(opt.ctx_size > 0, "--ctx-size must be positive (got {})", opt.ctx_size);
  LILY_CHECK(opt.prefill_chunk >= 0, "--prefill-chunk must be positive, or 0 for the backend's choice (got {})",
             opt.prefill_chunk);
  LILY_ASSERT(backend != nullptr && &backend->weights() == w.get());
  auto e = std::unique_ptr<Engine>(new Engine());
  e->weights_ = std::move(w);
  e->backend_ = std::move(backend);
  e->opt_ = opt;
  if (e->opt_.prefill_chunk == 0) e->opt_.prefill_chunk = e->backend_->preferred_prefill_chunk();
  return e;
}

}  // namespace lily
