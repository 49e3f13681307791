// The staging pass of the multi-row products (gemv_rows.cu, KernelSwitches::rows_stage): each activation row
// split once into the bf16 hi/lo pairs of its MMA B fragments and the Σx of each 64-wide chunk (layout in
// rows_frag.cuh), so that the product's blocks (one per weight tile and expert) load operands instead of
// converting every element again. The bits of the products do not change.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace lily::cuda {

struct RowsStaged {
  const uint32_t* x = nullptr;  // [rows][in] words
  const float* sx = nullptr;    // [rows][in / 64]
};

// Rows 0..rows-1 of x (ldx floats apart, 16-byte aligned, in % 64 == 0), RMS-normalised (· norm_w, eps)
// first when norm_w is set; mode 4: nibble pair order, else element order. Launched with PDL into the
// stream's staging buffer (gemm_stage.h), which the stream's next staged product reuses.
RowsStaged rows_stage(int mode, const float* x, int64_t ldx, int in, int rows, const float* norm_w, float eps,
                      cudaStream_t s);

}  // namespace lily::cuda
