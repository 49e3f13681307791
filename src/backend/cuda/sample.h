// Token sampling on the device: the transformations of the host Sampler (runtime/sampler.h), in its
// order and with its semantics, for one row of V logits, capturable in a CUDA graph (no host sync, no
// allocation; the penalty history and the draw counter live on the device and the kernels update them).
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
// Launches per draw: one memset + 5 kernels (penalties/max, coarse histogram of log-probabilities,
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

// Device buffers of the sampler for V tokens, carved out of one allocation of sample_bytes(V) bytes.
struct SampleDev {
  int V = 0;
  SampleParams* params = nullptr;  // [1]
  int32_t* counts = nullptr;       // [V] occurrences of each id in the penalty history
  uint64_t* step = nullptr;        // [1] draws so far: the RNG counter
  float* w = nullptr;              // [V] penalised logits of the last draw
  uint64_t* cand_key = nullptr;    // [V] candidate composites
  uint64_t* cand_mass = nullptr;   // [V] candidate masses (fixed point)
  void* ctl = nullptr;             // per-draw control block, zeroed at the start of each draw
  size_t ctl_bytes = 0;
};

size_t sample_bytes(int V);
// Lays the buffers out in `base` (sample_bytes(V) bytes of device memory, 256-byte aligned).
SampleDev sample_layout(void* base, int V);

// Uploads the parameters, the history counts (host_counts: V ints, null = all zero) and the draw counter,
// then waits for the copies (not capturable; call between generations).
void sample_setup(const SampleDev& d, const SampleParams& p, const int32_t* host_counts, uint64_t step, cudaStream_t s);

// Draws one token from logits[0:V] (device, float32) into *out (device) and records it: counts[out] += 1,
// step += 1. Capturable; reads the parameters from d.params at run time.
void sample(const SampleDev& d, const float* logits, int32_t* out, cudaStream_t s);

// The distribution the last sample() drew from: probs[i] (device, V doubles) = mass_i / Σ kept mass for
// kept ids, -1 for the others; greedy: 1 at the chosen id. For tests.
void sample_probs(const SampleDev& d, double* probs, cudaStream_t s);

// The uniform draw in [0, 1) used for (seed, step) (host copy of the device hash, for tests).
double sample_uniform(uint64_t seed, uint64_t step);

}  // namespace lily::cuda
