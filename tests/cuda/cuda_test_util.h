// Helpers for the CUDA tests: device buffers, random data, a relative-error measure.
#pragma once
#ifdef LILY_HAVE_CUDA
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/attn.h"
#include "backend/cuda/gdn.h"
#include "backend/cuda/ops.h"
#include "core/half.h"

namespace lily::cudatest {

#define LILY_REQUIRE_GPU() \
  do {                     \
    if (!::lily::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
    ::lily::cuda::init_kernels(); /* shared-memory limits, as a backend would set them */ \
  } while (0)

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : n(count) { LILY_CU(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { up(h); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void up(const std::vector<T>& h) { LILY_CU(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> down() const {
    std::vector<T> h(n);
    LILY_CU(cudaDeviceSynchronize());
    LILY_CU(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // Fills with a NaN pattern so unwritten outputs show up.
  void poison() { LILY_CU(cudaMemset(p, 0xff, std::max<size_t>(1, n) * sizeof(T))); }
};

// The process-wide kernel switches edited for the duration of a scope (restored after). A backend sets
// its own switches before each step, so this governs direct kernel calls only.
struct SwitchesScope {
  cuda::KernelSwitches saved = cuda::kernel_switches();
  explicit SwitchesScope(const std::function<void(cuda::KernelSwitches&)>& edit) {
    cuda::KernelSwitches k = saved;
    edit(k);
    cuda::set_kernel_switches(k);
  }
  SwitchesScope(const SwitchesScope&) = delete;
  SwitchesScope& operator=(const SwitchesScope&) = delete;
  ~SwitchesScope() { cuda::set_kernel_switches(saved); }
};
// Prompt GEMMs in the split (high-precision) mode: the fp32-class tolerances of the kernel tests.
struct HighPrecisionScope : SwitchesScope {
  HighPrecisionScope() : SwitchesScope([](cuda::KernelSwitches& k) { k.gemm_prec = cuda::GemmPrec::kSplit; }) {}
};
// Backend options with the prompt GEMMs in the split mode (`--precision high`).
inline CudaOptions high_precision_options() {
  CudaOptions o;
  o.kernels.gemm_prec = cuda::GemmPrec::kSplit;
  return o;
}

inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// bf16-representable random matrix: (bits, float values).
inline std::pair<std::vector<uint16_t>, std::vector<float>> randn_bf16(size_t n, std::mt19937& rng, float scale) {
  std::vector<float> f = randn(n, rng, scale);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) {
    b[i] = f32_to_bf16(f[i]);
    f[i] = bf16_to_f32(b[i]);
  }
  return {b, f};
}

inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// ||a - b|| / ||b||; NaN anywhere gives +inf.
inline double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace lily::cudatest
#endif
