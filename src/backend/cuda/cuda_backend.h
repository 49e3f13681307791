// The CUDA backend (plain C++ header: no CUDA types). Built when nvcc is present (LILY_HAVE_CUDA).
//
// Storage on the device: dense weights bf16 (f32/f16 checkpoints are rounded to bf16 at upload), norms
// and small GDN vectors fp32, residual stream and activations fp32. Per sequence: KV cache bf16
// [Hkv, capacity, hd] per attention layer, conv state fp32 [K-1, C] and recurrent state fp32
// [Hv, dv, dk] per DeltaNet layer, and the position counter on the device.
// Decode steps (T = 1) are captured as one CUDA graph per context-length bucket and replayed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace lily {

struct CudaOptions {
  int device = 0;
  bool graphs = true;  // capture 1-row decode steps as CUDA graphs (one per context bucket)
  int chunk_min = 64;  // DeltaNet: steps of at least this many rows use the chunked rule
  bool profile = false;  // time every block with events (uncaptured steps only; adds synchronisation)
};

// Milliseconds per block kind ("embed", "gdn", "attn", "ffn", "head") summed over the steps run with
// CudaOptions::profile, and the number of steps; empty when profiling is off.
struct CudaBlockProfile {
  std::vector<std::pair<std::string, double>> ms;
  int64_t steps = 0;
};
CudaBlockProfile cuda_block_profile(Backend& be);

// True when the binary has the CUDA backend and a usable CUDA device is present.
bool cuda_available();
// "NVIDIA H200 (sm_90, 132 SMs, 139 GiB)" or the reason none is usable.
std::string cuda_device_info(int device = 0);

// Uploads the weights; throws InputError when a weight format is not supported on CUDA.
std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights, const CudaOptions& opt = {});

// Greedy decoding on the GPU: feeds `first`, then each argmax back as the next input (token id written
// into the next step's input slot on the device), for at most n steps. on_token(id) is called for each
// produced id as it arrives (copied out asynchronously, one step behind); returning false stops early.
// Returns the number of ids produced. `be` must come from make_cuda_backend.
int64_t cuda_generate_greedy(Backend& be, SequenceState& st, int32_t first, int64_t n,
                             const std::function<bool(int32_t)>& on_token);

// One kernel launch of a captured decode step (`lily inspect`).
struct KernelLaunch {
  std::string name;
  int layer = -1;  // -1: outside the layers (embed, head)
  std::string block;  // "embed", "gdn", "attn", "ffn", "head", "step"
  unsigned grid[3] = {1, 1, 1}, threads[3] = {1, 1, 1};
  size_t smem = 0;
};
// Captures (without running) the decode step at context length ctx and lists its kernels in order.
std::vector<KernelLaunch> cuda_describe_decode_step(Backend& be, int64_t ctx);

}  // namespace lily
