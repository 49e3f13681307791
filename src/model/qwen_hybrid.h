// The forward pass of the Qwen hybrid models as a sequence of backend blocks.
#pragma once
#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace lily {

// Runs one step (rows of one or more sequences) through the blocks: embed, per layer the DeltaNet or
// attention mixer and the FFN, then the head. Returns the backend's ticket: Backend::finish brings the
// outputs to the host. An MTP step (Step::mtp) runs embed, the MTP layer (index cfg.layers) and the head.
// Throws InputError for token ids outside the vocabulary, rows past a context, or an MTP step on a model
// without the MTP block (naming the missing tensors).
uint64_t forward(Backend& be, const Step& step);

// One sequence, synchronously: appends `tokens` to `st`; logits ([logit_rows, V]) of its last logit_rows rows.
void forward_step(Backend& be, SequenceState& st, std::span<const int32_t> tokens, int64_t logit_rows, float* logits);

}  // namespace lily
