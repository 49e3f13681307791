// The seam between the model and the backends. The forward pass is a fixed sequence of blocks
// (model/qwen_hybrid.cpp); each backend implements each block as it likes. A block reads and updates
// the backend-owned residual stream x [T, H] of the current step:
//   embed:      x = embed_tokens[tokens]
//   gdn_mixer:  x += GatedDeltaNet(RMSNorm(x, input_norm))   (conv + recurrent state updated)
//   attn_mixer: x += GatedAttention(RMSNorm(x, input_norm))  (KV cache appended)
//   ffn:        x += MoE(RMSNorm(x, post_norm))              (or the dense MLP)
//   head:       logits = RMSNorm(x, final_norm) · lm_headᵀ for the selected rows
// Rows of one step are consecutive tokens of one sequence at positions state.n_tokens() + t.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/weights.h"

namespace lily {

// Per-sequence state (KV cache, conv state, fp32 recurrent state), owned by a backend. Snapshots are
// deep copies; restoring a snapshot brings the sequence back to exactly that point.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  virtual int64_t n_tokens() const = 0;   // tokens absorbed so far (next position)
  virtual int64_t capacity() const = 0;   // most tokens the KV cache can hold
  virtual std::unique_ptr<SequenceState> clone() const = 0;
  virtual void restore(const SequenceState& snapshot) = 0;  // snapshot from the same backend and model
  virtual void reset() = 0;
  virtual size_t nbytes() const = 0;      // memory used by the tokens absorbed so far
};

// Decoding with the sampler on the device (Backend::decode_on_device). Sampling fields as in
// SamplingParams (runtime/sampler.h), with the seed resolved.
struct DeviceSampling {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  uint64_t seed = 0;
};
struct DeviceDecode {
  DeviceSampling sampling;
  const float* first_logits = nullptr;  // host, V floats: the first token is drawn from this row
  std::span<const int32_t> history;    // ids the penalties count before the first draw
  std::span<const int32_t> stop_ids;
  int64_t max_tokens = 0;
  int32_t vocab_limit = 0;  // ids >= this are never drawn (tokenizer smaller than the model); 0: all
};
struct DeviceDecodeResult {
  std::vector<int32_t> tokens;  // emitted, in order
  int64_t absorbed = 0;         // tokens[0:absorbed] were appended to the state (all of them, unless it filled)
  bool stopped = false;         // a stop id or on_token said stop; otherwise max_tokens or a full context
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelWeights& weights() const = 0;

  // max_tokens bounds the KV cache; the backend may grow it lazily.
  virtual std::unique_ptr<SequenceState> new_state(int64_t max_tokens) = 0;

  // One step of T rows. Blocks are called between begin and end in model order.
  virtual void begin(SequenceState& st, int64_t T) = 0;
  virtual void embed(const int32_t* tokens) = 0;
  virtual void gdn_mixer(int layer) = 0;
  virtual void attn_mixer(int layer) = 0;
  virtual void ffn(int layer) = 0;
  // Logits [rows, V] (float32, host memory) of the last `rows` rows of the step.
  virtual void head(int64_t rows, float* logits) = 0;
  virtual void end() = 0;  // the state now holds n_tokens() + T tokens

  // Waits for queued device work (no-op on the CPU). Timings are taken after it.
  virtual void synchronize() {}
  // Peak bytes of memory this backend allocated (weights + state + scratch), for reports.
  virtual size_t peak_memory() const { return 0; }
  // Prompt tokens per forward step when the caller leaves the choice to the backend.
  virtual int64_t preferred_prefill_chunk() const { return 2048; }
  // Measured copy bandwidth of the memory the weights live in, bytes/s counting read + write (e.g. a
  // device-to-device cudaMemcpy of a large buffer). 0: host memory, which `lily bench` measures itself.
  virtual double copy_bandwidth() { return 0; }

  // Token-by-token generation with sampling (and the fed-back id) on the device. Contract:
  // t0 is drawn from req.first_logits, each next token from the logits after the previous one; on_token(t)
  // is called for each emitted token in order. Emission ends after a token that is a stop id or that
  // on_token rejects (stopped), after the max_tokens-th token, or after a token the state cannot absorb
  // (context full). Every emitted token that fits is absorbed into `st`, the last one included, so `st`
  // ends exactly after tokens[0:absorbed]; draws the device made beyond that are discarded. last_logits
  // (V floats, may be null) receives the logits after the last absorbed token when absorbed > 0.
  virtual bool can_decode_on_device() const { return false; }
  virtual DeviceDecodeResult decode_on_device(SequenceState& /*st*/, const DeviceDecode& /*req*/,
                                              const std::function<bool(int32_t)>& /*on_token*/, float* /*last_logits*/) {
    throw InternalError("backend '" + name() + "' has no on-device decoding");
  }
};

}  // namespace lily
