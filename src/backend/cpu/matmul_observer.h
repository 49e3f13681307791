// An optional observer of every CPU product's input rows, for calibration (Hessian capture by
// `lily quantize --calibration`). Off (null) by default; set and cleared by one thread while no forward
// pass runs. The observer is called on the forward thread before the product, with W's checkpoint name.
#pragma once
#include <cstdint>

#include "model/linear.h"

namespace lily::cpu {

using MatmulObserver = void (*)(void* ctx, const Linear& W, const float* x, int64_t T);
void set_matmul_observer(MatmulObserver fn, void* ctx);
// Calls the observer if one is set (the dense and quantized products both come through matmul()).
void observe_matmul(const Linear& W, const float* x, int64_t T);

}  // namespace lily::cpu
