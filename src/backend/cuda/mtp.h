// Kernels of the MTP step (model doc §5) and of the hidden rows main steps keep for it, callable from
// plain C++. They read each row's group and slot from the step descriptor and the slot table's MTP row
// (step_desc.h), so a captured graph serves any slots.
#pragma once
#include "backend/cuda/ops.h"
#include "backend/cuda/step_desc.h"

namespace lily::cuda {

// The MTP block's input rows: cat[t] = [RMSNorm(e[t]) · norm_e ‖ RMSNorm(h_t) · norm_h] ([T][2H], row stride
// ldc) for the embedded tokens e [T][H] and each row's hidden input h_t from its slot's entry of the MTP
// row `slots`: hidden[t] >= 0 is row hidden[t] of its kept rows, hidden[t] < 0 (kMtpHidden) its h'.
void mtp_inputs(const float* e, const float* norm_e, const float* norm_h, int H, float eps, const int32_t* hidden, int T,
                const int32_t* row_group, const DevGroup* groups, const DevSlotLayer* slots, float* cat, int64_t ldc,
                cudaStream_t s);

// Rows of the residual x [.][H] through a norm into their slots' entries of the MTP row `slots`,
// y = RMSNorm(x[t]) · w:
//   KeepMode::Rows: each of the step's n rows t whose group has keep != 0, to hidden + (t - first)·H;
//   KeepMode::Last: the last row of each of the n groups, to hprime.
enum class KeepMode { Rows, Last };
void keep_rows(const float* x, const float* w, int H, float eps, KeepMode mode, int n, const int32_t* row_group,
               const DevGroup* groups, const DevSlotLayer* slots, cudaStream_t s);

}  // namespace lily::cuda
