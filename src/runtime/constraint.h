// A constraint on the tokens a request may emit (structured outputs, forced tool calls). The generation
// loop asks it for the allowed ids before each draw and tells it each emitted token; a sampler never
// draws a masked id. Implementations (text/ grammars compiled against a tokenizer's vocabulary) cache the
// mask per grammar state so that allowed() costs microseconds, not the vocabulary size.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

namespace lily {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Allowed ids for the next token: bit (id % 64) of word id / 64 over the model's vocabulary
  // ((vocab + 63) / 64 words; ids past the tokenizer's vocabulary are 0). Valid until the next accept().
  virtual std::span<const uint64_t> allowed() = 0;
  // Advances past `token`, which allowed() permitted. Throws InternalError for a masked id.
  virtual void accept(int32_t token) = 0;
  // The output so far is a complete document: only end-of-generation ids are allowed now.
  virtual bool complete() const = 0;
  // An independent copy at the same point (speculative drafts are checked on a copy).
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
};

}  // namespace lily
