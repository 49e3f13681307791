// A step's sequences as the kernels see them: the per-step descriptor (groups and the group of each row,
// uploaded once per step) and the pool's slot table (where each slot keeps its state, per layer). Plain
// C++, no CUDA types: the backend builds the host copies, the kernels read the device copies, so a
// captured graph serves any slots.
#pragma once
#include <cstdint>

namespace lily::cuda {

// One group of a step: consecutive rows of one sequence.
struct DevGroup {
  int32_t first = 0, rows = 0;  // rows [first, first + rows) of the step
  int32_t slot = 0;             // pool slot (index into the slot table)
  int32_t tentative = 0;        // 1: the DeltaNet keeps its state after every row (versions cur + 1 + j)
  int32_t cur = 0, ring = 1;    // the sequence's current state version; versions in its ring (>= 1)
  int32_t keep = 0;             // main steps: 1 keeps the rows after the final norm (StepGroup::keep_hidden)
  int64_t pos = 0;              // tokens (MTP steps: MTP rows) the sequence holds before the step: row
                                // first + i sits at pos + i
};

// One slot's state in one layer (the table holds [layers][slot_capacity] of them, plus an MTP row [slot_capacity]
// when the model has an MTP block).
struct DevSlotLayer {
  uint16_t* k = nullptr;  // attention: keys [Hkv][cap][hd] bf16
  uint16_t* v = nullptr;  // attention: values, same layout
  int64_t cap = 0;        // attention: KV rows
  float* conv = nullptr;  // DeltaNet: version r of the conv state [K-1][C] at conv + r·(K-1)·C
  float* S = nullptr;     // DeltaNet: version r of the recurrent state [Hv][dv][dk] at S + r·Hv·dv·dk
  // The MTP row of the table (layer index cfg.layers; k, v, cap: the MTP layer's KV cache):
  float* hidden = nullptr;  // kept post-final-norm rows of the latest main step [rows][H]
  float* hprime = nullptr;  // h' of the last row of the latest MTP step [H]
};

// Where the rows of a call live. Single-sequence form (row_group == null): every row of the call belongs
// to one sequence at positions *pos + t with caches k, v (cap), conv state `conv` and state `S` (one
// version). Step form: row t belongs to group row_group[t] of `groups`, whose slot's entries in `slots`
// (the current layer's row of the table) hold the state.
struct StepSeqs {
  const int32_t* row_group = nullptr;
  const DevGroup* groups = nullptr;
  const DevSlotLayer* slots = nullptr;
  const int64_t* pos = nullptr;
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
  int64_t cap = 0;
};

}  // namespace lily::cuda
