// The CUDA backend's public functions (cuda_backend.h).
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_impl.h"
#include "core/error.h"

namespace lily {

bool cuda_available() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

std::string cuda_device_info(int device) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("no usable CUDA device ({})", cudaGetErrorString(e));
  }
  if (device < 0 || device >= n) return fmt::format("no CUDA device {} ({} present)", device, n);
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "CUDA device properties unavailable";
  return fmt::format("{} (sm_{}{}, {} SMs, {:.0f} GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
                     double(p.totalGlobalMem) / (1024.0 * 1024 * 1024));
}

std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights, const CudaOptions& opt) {
  if (!cuda_available()) fail("CUDA backend: {}", cuda_device_info(opt.device));
  return std::make_unique<cuda::CudaBackend>(std::move(weights), opt);
}

CudaBlockProfile cuda_block_profile(Backend& be) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&be);
  if (!cb) fail("cuda_block_profile needs the CUDA backend, got '{}'", be.name());
  return cb->block_profile();
}

std::vector<KernelLaunch> cuda_describe_decode_step(Backend& be, int64_t ctx, int rows, int groups) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&be);
  if (!cb) fail("cuda_describe_decode_step needs the CUDA backend, got '{}'", be.name());
  return cb->describe(ctx, rows, groups);
}

CudaMkInfo cuda_mk_info(Backend& be) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&be);
  if (!cb) fail("cuda_mk_info needs the CUDA backend, got '{}'", be.name());
  return cb->mk_info();
}

}  // namespace lily

namespace lily::cuda {

double CudaBackend::copy_bandwidth() {
  if (copy_bw_ > 0) return copy_bw_;
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (cudaMalloc(&b, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(a);
    return 0;
  }
  cudaEvent_t e0, e1;
  LILY_CU(cudaEventCreate(&e0));
  LILY_CU(cudaEventCreate(&e1));
  std::vector<double> bw;
  for (int i = 0; i < 6; ++i) {
    LILY_CU(cudaEventRecord(e0, stream_));
    LILY_CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream_));
    LILY_CU(cudaEventRecord(e1, stream_));
    LILY_CU(cudaEventSynchronize(e1));
    float ms = 0;
    LILY_CU(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0) bw.push_back(2.0 * double(bytes) / (double(ms) * 1e-3));  // first copy: warm-up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  std::sort(bw.begin(), bw.end());
  copy_bw_ = bw[bw.size() / 2];
  return copy_bw_;
}

}  // namespace lily::cuda
