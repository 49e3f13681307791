// The seam between the model and the backends. The forward pass is a fixed sequence of blocks
// (model/qwen_hybrid.cpp); each backend implements each block as it likes. A block reads and updates
// the backend-owned residual stream x [T, H] of the current step:
//   embed:      x = embed_tokens[tokens]
//   gdn_mixer:  x += GatedDeltaNet(RMSNorm(x, input_norm))   (conv + recurrent state updated)
//   attn_mixer: x += GatedAttention(RMSNorm(x, input_norm))  (KV cache appended)
//   ffn:        x += MoE(RMSNorm(x, post_norm))              (or the dense MLP)
//   head:       logits = RMSNorm(x, final_norm) · lm_headᵀ for the output rows (or ids drawn from them)
// An MTP step (Step::mtp, model doc §5) runs the same blocks over the MTP block, its layer addressed as
// layer index cfg.layers (ModelWeights::mtp):
//   embed:      x = fc([RMSNorm(embed[token], norm_embed) ‖ RMSNorm(hidden, norm_hidden)])
//   attn_mixer(cfg.layers), ffn(cfg.layers): the MTP decoder layer, with the sequence's MTP KV cache
//   head:       h' = RMSNorm(x, mtp.norm); logits = h' · lm_headᵀ for the output rows
// Its rows sit at MTP positions seq.mtp_tokens() + i; each row's hidden input is a kept post-final-norm
// row of the sequence's latest main step (StepGroup::keep_hidden) or the h' of its previous MTP step.
// A step (Step below) holds rows of one or more sequences: each group is consecutive tokens of one
// sequence at positions seq.n_tokens() + i. Every row is independent of the other groups of its step
// (a sequence's result does not depend on what it is batched with). The seam carries no generation
// policy: stop ids, max tokens and vocabulary limits belong to the runtime.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/weights.h"

namespace lily {

// A saved point of one sequence's state: the part in use only (KV rows of the absorbed tokens, conv and
// recurrent state), restorable into any sequence of the same backend with enough capacity.
class StateSnapshot {
 public:
  virtual ~StateSnapshot() = default;
  virtual int64_t n_tokens() const = 0;
  virtual size_t nbytes() const = 0;  // memory it really holds
  // Every value it holds as float32 in a fixed order (tests compare states; copies from the device).
  virtual std::vector<float> contents() const = 0;
};

// One sequence slot of the backend's pool: KV rows per attention layer, conv state and fp32 recurrent
// state per DeltaNet layer, and (when reserved) checkpoints for tentative steps.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  virtual int64_t n_tokens() const = 0;   // committed tokens (the next row's position)
  virtual int64_t capacity() const = 0;   // most tokens the KV cache can hold
  // Rows of the last tentative step awaiting commit() (0 when none). A sequence with pending rows takes
  // part in no step until commit().
  virtual int64_t pending() const = 0;
  // Keeps the first n pending rows (0 <= n <= pending()): KV length n_tokens() + n, conv and recurrent
  // state as after row n - 1 (or as before the step for n = 0). Rejected rows cost no state copy.
  virtual void commit(int64_t n) = 0;
  // Rows a tentative step of this sequence may hold (reserve_tentative).
  virtual int max_tentative() const = 0;
  // Reserves checkpoints for tentative steps of up to `rows` rows (rows <= kMaxTentativeRows).
  virtual void reserve_tentative(int rows) = 0;
  virtual std::unique_ptr<StateSnapshot> snapshot() const = 0;
  // A snapshot from the same backend and model; throws InputError when it does not fit the capacity.
  // Snapshots hold the MTP KV rows too; a restored sequence has no kept hidden rows.
  virtual void restore(const StateSnapshot& s) = 0;
  virtual void reset() = 0;
  virtual size_t nbytes() const = 0;      // memory used by the tokens absorbed so far

  // The MTP layer's KV cache (MTP steps): pairs it holds, i.e. the next MTP position (0 when no MTP step
  // ran). truncate_mtp(n) keeps the first n (n <= mtp_tokens()): drops draft rows after a draft chain.
  virtual int64_t mtp_tokens() const = 0;
  virtual void truncate_mtp(int64_t n) = 0;
  // Post-final-norm rows the latest main step of this sequence kept (StepGroup::keep_hidden; after a
  // commit(n) only its first n), 0 when it kept none.
  virtual int64_t hidden_rows() const = 0;
};
constexpr int kMaxTentativeRows = 17;  // a verification of 16 drafted tokens and the token before them

// Sampling on the device, per sequence (Backend::set_sampling). Fields as in SamplingParams
// (runtime/sampler.h) with the seed resolved.
struct DeviceSampling {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f, min_p = 0.0f;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  uint64_t seed = 0;
  int32_t vocab_limit = 0;                          // ids >= this are never drawn; 0: all
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits before everything else
};

// Input of a row whose id the device drew for the same sequence in the previous step that sampled it
// (the decode pipeline: the host need not have seen the id yet).
constexpr int32_t kFedToken = -1;

// Hidden input of an MTP row (Step::hidden): the h' of the last row of the sequence's previous MTP step
// (a draft chain). Values >= 0 name a kept row of the sequence's latest main step.
constexpr int32_t kMtpHidden = -1;

struct StepGroup {
  SequenceState* seq = nullptr;
  int32_t first = 0, rows = 0;  // rows [first, first + rows) of Step::tokens
  int32_t out_rows = 0;         // the group's last out_rows rows produce outputs
  bool logits = true;           // outputs include logits rows (copied to the host)
  // Outputs include ids drawn on the device with the sequence's sampler. MTP steps: the argmax of each
  // output row instead (lowest id on ties; no sampler, no fed id), for greedy drafts.
  bool sample = false;
  // Keep a checkpoint after every row; the rows stay pending until seq->commit(n). Needs
  // rows <= seq->max_tentative(). Main steps only.
  bool tentative = false;
  // Main steps: the backend keeps this group's rows after the final norm (every row) as the hidden
  // inputs of the sequence's next MTP step; a main step without it drops the sequence's kept rows.
  bool keep_hidden = false;
};

struct Step {
  std::vector<int32_t> tokens;  // one per row: a token id, or kFedToken
  std::vector<StepGroup> groups;
  // An MTP step (model doc §5): every row runs through the MTP block; hidden[r] is row r's hidden input
  // (a kept main row of its sequence, or kMtpHidden). Groups are neither tentative nor keep_hidden.
  bool mtp = false;
  std::vector<int32_t> hidden;
  // MTP steps: the head covers ids [0, head_vocab) only (0: all). Logits past it come back as -inf and the
  // argmax is among the first head_vocab ids. A backend whose head cannot be cut there (EXL3 or sharded
  // heads) computes every id; either way the outputs are valid drafts.
  int32_t head_vocab = 0;

  // Appends a group of `toks` for `seq`; returns its index.
  size_t add(SequenceState& seq, std::span<const int32_t> toks, int32_t out_rows, bool logits = true,
             bool sample = false, bool tentative = false);
  // MTP steps: a group of rows (toks[i], hid[i]) for `seq`.
  size_t add_mtp(SequenceState& seq, std::span<const int32_t> toks, std::span<const int32_t> hid, int32_t out_rows,
                 bool logits = true, bool sample = false);
  int64_t rows() const { return int64_t(tokens.size()); }
  int64_t logit_rows() const;   // rows whose logits come back, in group order
  int64_t sample_rows() const;  // rows whose drawn ids come back, in group order
  // Throws InternalError naming the group when the step is malformed: a sequence twice, a sequence with
  // pending rows, rows past the capacity, a tentative group beyond max_tentative(), bad row ranges,
  // token ids outside [0, vocab) other than kFedToken, out_rows > rows, outputs asked for no kind; for
  // an MTP step also a hidden input past the sequence's kept rows, kMtpHidden other than on a group's
  // first row, tentative or keep_hidden groups. (Whether a kMtpHidden row has an h' to read is the
  // backend's check.)
  void validate(int64_t vocab) const;
};

// Where a step's outputs land on the host once Backend::finish returns: logits [logit_rows, V] and ids
// [sample_rows], both in group order (a group's rows in row order). Either may be null when the step
// asks for none of that kind.
struct StepOutputs {
  float* logits = nullptr;
  int32_t* ids = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelWeights& weights() const = 0;

  // A new sequence slot; max_tokens bounds its KV cache. Throws InputError when the pool is full or the
  // memory is exhausted.
  virtual std::unique_ptr<SequenceState> new_state(int64_t max_tokens) = 0;

  // One step. Blocks are called between begin and end in model order. begin() checks the step
  // (Step::validate) and the sequences' ownership.
  virtual void begin(const Step& step) = 0;
  virtual void embed() = 0;
  virtual void gdn_mixer(int layer) = 0;
  virtual void attn_mixer(int layer) = 0;
  virtual void ffn(int layer) = 0;
  virtual void head() = 0;  // the step's outputs (logits and/or drawn ids)
  // Ends the step: every non-tentative group's sequence now holds its rows; tentative rows are pending.
  // Returns a ticket for finish(). The outputs need not be on the host yet.
  virtual uint64_t end() = 0;
  // Waits until the outputs of the step with this ticket are copied to `out` (see StepOutputs). Steps
  // finish in order; each ticket is finished exactly once.
  virtual void finish(uint64_t ticket, const StepOutputs& out) = 0;

  // Device sampling (groups with `sample`): the sequence's parameters and the ids its penalties count
  // (prompt and/or generated, as the runtime chooses); each drawn id is added to that history. A
  // backend without a sampler (can_sample() false) throws InternalError here and in begin() for a step
  // that samples.
  virtual bool can_sample() const { return false; }
  virtual void set_sampling(SequenceState& /*seq*/, const DeviceSampling& /*p*/, std::span<const int32_t> /*history*/) {
    throw InternalError("backend '" + name() + "' has no device sampler");
  }
  // Allowed-id mask for the next draw of `seq` (bit id%64 of word id/64; empty: no mask), used by its next
  // sampled step only.
  virtual void set_mask(SequenceState& /*seq*/, std::span<const uint64_t> /*mask*/) {
    throw InternalError("backend '" + name() + "' has no device sampler");
  }

  // Whether the backend runs MTP steps (Step::mtp, StepGroup::keep_hidden).
  virtual bool can_mtp() const { return false; }

  // Waits for queued device work (no-op on the CPU). Timings are taken after it.
  virtual void synchronize() {}
  // Peak bytes of memory this backend allocated (weights + state + scratch), for reports.
  virtual size_t peak_memory() const { return 0; }
  // Prompt tokens per forward step when the caller leaves the choice to the backend.
  virtual int64_t preferred_prefill_chunk() const { return 2048; }
  // Measured copy bandwidth of the memory the weights live in, bytes/s counting read + write (e.g. a
  // device-to-device cudaMemcpy of a large buffer). 0: host memory, which `lily bench` measures itself.
  virtual double copy_bandwidth() { return 0; }
};

}  // namespace lily
