// The Qwen hybrid forward pass (model doc §3.1), expressed in the blocks of backend/backend.h.
#pragma once
#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace lily {

// Runs `tokens` through the model after the tokens already in `st`, in one step; writes logits of the
// last `logit_rows` rows to `logits` ([logit_rows, V], may be null when logit_rows is 0).
void forward_step(Backend& be, SequenceState& st, std::span<const int32_t> tokens, int64_t logit_rows, float* logits);

}  // namespace lily
