// What test_cuda_ops.cpp and test_cuda_moe.cpp share: the kernel switches that send many-row products to
// the GEMVs, and the op families' cases (each against its double-precision reference at awkward sizes,
// under the switches in force).
#pragma once
#include "cuda_test_util.h"

namespace lily::cudatest {

// Rows of many-row products as per-row GEMVs instead of GEMMs (the multi-row products of rows.h off unless
// asked for), for the duration of a scope.
struct GemvRowsScope {
  lily::cuda::KernelSwitches saved = lily::cuda::kernel_switches();
  GemvRowsScope(int dense, int moe, int rows_dense = 0, int rows_moe = 0, int rows_min = 6) {
    auto k = saved;
    k.gemv_rows = dense;
    k.moe_gemv_rows = moe;
    k.rows_dense = rows_dense;
    k.rows_moe = rows_moe;
    k.rows_min = rows_min;
    lily::cuda::set_kernel_switches(k);
  }
  ~GemvRowsScope() { lily::cuda::set_kernel_switches(saved); }
};

void moe_cases();  // test_cuda_moe.cpp: routed and shared experts, fused norm, stacked shared expert

}  // namespace lily::cudatest
