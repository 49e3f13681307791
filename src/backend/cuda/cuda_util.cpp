// Host-side error helpers of the CUDA backend (kept out of .cu files: nvcc cannot compile fmt).
#include <algorithm>

#include <fmt/format.h>

#include "backend/cuda/device_info.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/switches.h"
#include "core/error.h"

namespace lily::cuda {

void check(cudaError_t e, const char* file, int line) {
  if (e != cudaSuccess)
    throw InternalError(fmt::format("CUDA error {} ({}) at {}:{}", cudaGetErrorName(e), cudaGetErrorString(e), file, line));
}

void fail_internal(const char* what) { throw InternalError(what); }

int device_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return v > 0 ? v : 132;
  }();
  return n;
}

int device_cc_major() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
      return 0;
    return v;
  }();
  return n;
}

namespace {
KernelSwitches g_switches;
}
void set_kernel_switches(const KernelSwitches& s) { g_switches = s; }
const KernelSwitches& kernel_switches() { return g_switches; }
int norm_fuse_rows() {
  // a fused norm needs every product of the step on a path that takes it: the GEMVs (dense up to gemv_rows,
  // the MoE per slot up to moe_gemv_rows) or the dense multi-row product
  const KernelSwitches& k = g_switches;
  return std::max(kGemvMaxRows, std::min({k.norm_rows, k.gemv_rows, k.moe_gemv_rows, kNormRowsMax}));
}

}  // namespace lily::cuda
