// Session: one sequence on an Engine — its tokens and backend state. Prompts are absorbed in chunks
// of EngineOptions::prefill_chunk tokens; decoding feeds one token per step. Not thread-safe: one
// thread drives a session at a time (the engine itself may serve many sessions one step at a time).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace lily {

// A saved point of a sequence: its tokens and a deep copy of its state.
struct Snapshot {
  std::vector<int32_t> tokens;
  std::shared_ptr<const SequenceState> state;
  std::vector<float> last_logits;  // logits after the last token (V floats)
  size_t nbytes() const { return state ? state->nbytes() : 0; }
};

class Session {
 public:
  explicit Session(Engine& engine, int64_t ctx_size = 0);  // 0: engine default

  Engine& engine() { return *engine_; }
  int64_t n_tokens() const { return int64_t(tokens_.size()); }
  int64_t capacity() const { return state_->capacity(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Logits after the last absorbed token (empty before the first token).
  const std::vector<float>& last_logits() const { return last_logits_; }

  // Appends `tokens`. last_logits (V floats) receives the logits after the final token; all_logits
  // ([tokens.size(), V]) receives every row (teacher forcing). Either may be null.
  void prefill(std::span<const int32_t> tokens, float* last_logits, float* all_logits = nullptr);
  // Appends one token and writes the logits that predict the next one.
  void decode(int32_t token, float* logits);

  // Whether the backend can generate with sampling on the device (Backend::decode_on_device).
  bool can_decode_on_device() { return engine_->backend().can_decode_on_device(); }
  // Generates from last_logits() on the device (req.first_logits is ignored). The session then holds
  // every absorbed token (tokens[0:absorbed]: all emitted ones that fit) and the logits after the last.
  DeviceDecodeResult decode_on_device(const DeviceDecode& req, const std::function<bool(int32_t)>& on_token);

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
