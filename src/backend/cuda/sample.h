// Token sampling on the device: the transformations of the host Sampler (runtime/sampler.h), in its
// order and with its semantics, for any number of rows of V logits at once (each with its sequence's
// parameters), capturable in a CUDA graph (no host sync, no allocation; the penalty history and the draw
// counter live on the device and the kernels update them). Before the sampler's own order: the logit bias,
// then the vocabulary limit and the allowed-id mask (-inf), as the generation loop's host path does.
//
// Order (as the host): penalties over the history counts (repetition, then presence + frequency·count);
// temperature 0: the highest penalised logit, lowest id on ties; otherwise candidates in the order
// (logit desc, id asc), top-k, probabilities exp((l - max) / T) normalised over the top-k set, min-p
// (p >= p_max · min_p), top-p (the shortest prefix whose mass reaches top_p), then a draw.
//
// Exactness: tokens are ordered by a 50-bit composite (order-preserving float key << 18 | (2^18-1-id)),
// so ties resolve by id exactly as on the host. Masses are fixed point (round(e · 2^44), integer sums:
// deterministic, no float atomics); the top-p cut and the draw compare integer prefix sums, so a set
// can differ from the host's only when the host's cumulative probability is within ~1e-12 of top_p.
// The draw uses a counter-based hash of (seed, step): the same seed and history give the same tokens on
// the device (not the host's mt19937 tokens).
//
// Launches per call (all rows together): one memset + 5 kernels (penalties/max, coarse histogram of log-probabilities,
// plan, compaction of the candidate bins, exact radix select in one block).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lily::cuda {

constexpr int kSampleMaxVocab = 1 << 18;  // ids must fit the composite's 18 bits

// Sampling parameters as the kernels read them (device copy); fields as in SamplingParams.
struct SampleParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_k = 0;
  int32_t vocab_limit = 0;  // ids >= this get logit -inf (never drawn); 0: none
  uint64_t seed = 0;
};

// One sequence's sampler on the device (an entry of the backend's per-slot table): parameters, the penalty
// history as counts, an optional dense logit bias and an allowed-id mask for its next draw, the RNG counter.
struct SampleSlot {
  SampleParams p;
  int32_t* counts = nullptr;       // [V] occurrences of each id in the penalty history
  const float* bias = nullptr;     // [V] added to the logits before everything else; null: none
  const uint64_t* mask = nullptr;  // [ceil(V / 64)] allowed ids (bit id % 64 of word id / 64)
  int32_t mask_on = 0;             // 1: the slot's next draw applies `mask` (the draw clears it); follows mask
  uint64_t step = 0;               // draws so far: the RNG counter (last: the host rewrites the fields before it)
};

// Per-row scratch of one call of up to `rows` draws, carved out of sample_bytes(V, rows) bytes of device
// memory (256-byte aligned base).
struct SampleDev {
  int V = 0, rows = 0;
  float* w = nullptr;            // [rows][V] penalised logits of the last call's rows
  uint64_t* cand_key = nullptr;  // [rows][V] candidate composites
  uint64_t* cand_mass = nullptr; // [rows][V] candidate masses (fixed point)
  void* ctl = nullptr;           // [rows] control blocks, zeroed at the start of each call
  size_t ctl_bytes = 0;          // one control block
};

size_t sample_bytes(int V, int rows = 1);
SampleDev sample_layout(void* base, int V, int rows = 1);

// n draws in one pass (device arrays of n entries): row r draws from logits row src[r] (null: r; V floats
// each) with the sampler slots[slot[r]] at RNG counter slots[slot[r]].step + off[r] (off null: 0; off[r]: the
// row's rank among the call's rows of that slot, which all see the counts as before the call), into out[r]
// and, where fed_slot[r] >= 0, fed[fed_slot[r]]; then records it (counts[out[r]] += 1, step += 1, the mask
// cleared by the slot's first row). Capturable: everything is read on the device at run time.
void sample_rows(const SampleDev& d, SampleSlot* slots, const float* logits, int n, const int32_t* src,
                 const int32_t* slot, const int32_t* off, int32_t* out, cudaStream_t s,
                 const int32_t* fed_slot = nullptr, int32_t* fed = nullptr);

// The distribution row `row` of the last sample_rows drew from: probs[i] (device, V doubles) = mass_i / Σ
// kept mass for kept ids, -1 for the others; greedy: 1 at the chosen id. For tests.
void sample_probs(const SampleDev& d, const SampleSlot* slots, int row, double* probs, cudaStream_t s);

// The uniform draw in [0, 1) used for (seed, step) (host copy of the device hash, for tests).
double sample_uniform(uint64_t seed, uint64_t step);

}  // namespace lily::cuda
