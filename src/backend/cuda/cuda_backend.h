// The CUDA backend (plain C++ header: no CUDA types). Built when nvcc is present (LILY_HAVE_CUDA).
//
// Storage on the device: dense weights bf16 (f32/f16 checkpoints are rounded to bf16 at upload), norms
// and small GDN vectors fp32, residual stream and activations fp32. A pool of sequence slots: per slot
// a KV cache bf16 [Hkv, capacity, hd] per attention layer, and a ring of versions of the conv state
// fp32 [K-1, C] and the recurrent state fp32 [Hv, dv, dk] per DeltaNet layer (one version, or
// rows + 1 after reserve_tentative); with an MTP block also the MTP layer's KV cache, the post-final-norm
// rows its latest main step kept (fp32, grown to the longest kept step) and the h' of its latest MTP step.
// The slot table and each step's descriptor live on the device, so one captured decode graph serves any
// slots.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/gemm_bench.h"
#include "backend/cuda/switches.h"

namespace lily {

struct CudaOptions {
  int device = 0;
  bool graphs = true;    // capture decode steps (short groups of equal length) as CUDA graphs
  int chunk_min = 64;    // DeltaNet: groups of at least this many rows use the chunked rule
  bool profile = false;  // time every block with events (uncaptured steps only; adds synchronisation)
  bool ba_fold = true;   // DeltaNet b|a projection inside the step kernel for groups of 1-4 rows (bf16 b|a)
  bool topk_fold = true; // MoE top-k inside the router GEMV for steps of 1-4 tokens
  bool shared_in_stack = true;  // the shared expert as expert E of the routed stacks where formats match (upload)
  bool mk = false;       // one-row decode steps as one persistent kernel (mk.h) where the model is covered
  bool mk_trace = false; // the step kernel records a timeline of its tasks (cuda_mk_info's report)
  bool mk_skip_dots = false;  // timing experiment: the step kernel streams its weight tiles but skips their dot products
  int mk_stage_kb = 40;  // the step kernel's ring stage (the largest weight tile), KiB (32..100)
  std::string mk_trace_csv;  // with mk_trace: cuda_mk_info also writes the raw timeline of the latest step here
  cuda::KernelSwitches kernels;  // kernel-level switches (switches.h)
};

// Sets the option `name` (as listed by cuda_option_names) from `value` ("1"/"0", "on"/"off", "true"/
// "false", or a number); throws InputError naming the option for an unknown name or a bad value.
void set_cuda_option(CudaOptions& o, const std::string& name, const std::string& value);
// "name=value" (the form of the CLI's --cuda-opt).
void set_cuda_option(CudaOptions& o, const std::string& name_eq_value);
std::vector<std::string> cuda_option_names();

// Milliseconds per block kind ("embed", "gdn", "attn", "ffn", "head") summed over the steps run with
// CudaOptions::profile, and the number of steps; empty when profiling is off.
struct CudaBlockProfile {
  std::vector<std::pair<std::string, double>> ms;
  int64_t steps = 0;
};
CudaBlockProfile cuda_block_profile(Backend& be);

// The decode step kernel (CudaOptions::mk): why the model's shapes or formats are not covered ("" when they
// are), the steps that ran it, and the op list of the plan of the latest step key (type, layer, tiles, tasks,
// stage bytes, dependencies and dependency level per op).
struct CudaMkInfo {
  std::string uncovered;
  int64_t steps = 0;
  std::vector<std::string> ops;
  std::vector<std::string> trace;  // with CudaOptions::mk_trace: the timeline report of the latest step (synchronises)
};
CudaMkInfo cuda_mk_info(Backend& be);

// True when the binary has the CUDA backend and a usable CUDA device is present.
bool cuda_available();
// "NVIDIA H200 (sm_90, 132 SMs, 139 GiB)" or the reason none is usable.
std::string cuda_device_info(int device = 0);

// Uploads the weights; throws InputError when a weight format or a model shape (naming the config
// field) is not supported on CUDA.
std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights, const CudaOptions& opt = {});

// One kernel launch of a captured decode step (`lily inspect`).
struct KernelLaunch {
  std::string name;
  int layer = -1;  // -1: outside the layers (embed, head)
  std::string block;  // "embed", "gdn", "attn", "ffn", "head", "step"
  unsigned grid[3] = {1, 1, 1}, threads[3] = {1, 1, 1};
  size_t smem = 0;
};
// Captures (without running) the decode step the runtime's device path runs — `groups` sequences of
// rows / groups rows each at context length ctx, each drawing its last row's id greedily on the device —
// through the model's own forward() in record mode, and lists its kernels in order.
std::vector<KernelLaunch> cuda_describe_decode_step(Backend& be, int64_t ctx, int rows = 1, int groups = 1);

}  // namespace lily
