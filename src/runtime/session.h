// Session: one sequence on an Engine — its tokens and backend state (a slot of the backend's pool).
// Prompts are absorbed in chunks of EngineOptions::prefill_chunk tokens; decoding feeds one token per
// step. Not thread-safe: one thread drives a session at a time (the engine may step many sessions
// together: runtime/loop.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace lily {

// A saved point of a sequence: its tokens, the in-use part of its state, and the logits after the last
// token (empty when they were not read back: the snapshot then serves prompts that continue it).
struct Snapshot {
  std::vector<int32_t> tokens;
  std::shared_ptr<const StateSnapshot> state;
  std::vector<float> last_logits;
  size_t nbytes() const { return state ? state->nbytes() : 0; }
};

class Session {
 public:
  explicit Session(Engine& engine, int64_t ctx_size = 0);  // 0: engine default

  Engine& engine() { return *engine_; }
  int64_t n_tokens() const { return int64_t(tokens_.size()); }
  int64_t capacity() const { return state_->capacity(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Logits after the last absorbed token (empty before the first token, or when the step that absorbed
  // it read none back).
  const std::vector<float>& last_logits() const { return last_logits_; }
  SequenceState& state() { return *state_; }

  // Appends `tokens`. last_logits (V floats) receives the logits after the final token; all_logits
  // ([tokens.size(), V]) receives every row (teacher forcing). Either may be null.
  void prefill(std::span<const int32_t> tokens, float* last_logits, float* all_logits = nullptr);
  // Appends one token and writes the logits that predict the next one.
  void decode(int32_t token, float* logits);

  // For whoever stepped state() directly (the generation loop): `tokens` were absorbed; `logits` is the
  // row after the last of them (empty: not read back).
  void note_absorbed(std::span<const int32_t> tokens, std::span<const float> logits);

  Snapshot snapshot() const;
  void restore(const Snapshot& s);
  void reset();

 private:
  Engine* engine_;
  std::unique_ptr<SequenceState> state_;
  std::vector<int32_t> tokens_;
  std::vector<float> last_logits_;
};

}  // namespace lily
