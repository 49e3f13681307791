// Host-side error helpers of the CUDA backend (kept out of .cu files: nvcc cannot compile fmt).
#include <fmt/format.h>

#include "backend/cuda/ops.h"
#include "backend/cuda/switches.h"
#include "core/error.h"

namespace lily::cuda {

void check(cudaError_t e, const char* file, int line) {
  if (e != cudaSuccess)
    throw InternalError(fmt::format("CUDA error {} ({}) at {}:{}", cudaGetErrorName(e), cudaGetErrorString(e), file, line));
}

void fail_internal(const char* what) { throw InternalError(what); }

namespace {
KernelSwitches g_switches;
}
void set_kernel_switches(const KernelSwitches& s) { g_switches = s; }
const KernelSwitches& kernel_switches() { return g_switches; }

}  // namespace lily::cuda
