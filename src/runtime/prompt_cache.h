// Prompt cache: saved sequence states keyed by their token prefix, for reuse across requests.
// The attention KV cache could be cut back to any length, but the DeltaNet conv and recurrent states
// cannot, so a saved state is only reusable by a prompt that starts with exactly its tokens. Entries
// are least-recently-used evicted under a byte cap. Thread-safe.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/session.h"

namespace lily {

class PromptCache {
 public:
  struct Stats {
    uint64_t hits = 0, misses = 0, inserts = 0, evictions = 0;
    uint64_t entries = 0, bytes = 0;
  };

  explicit PromptCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // The entry with the most tokens that is a prefix of (or equal to) `tokens`; null when none.
  // A hit moves the entry to the front of the LRU order.
  std::shared_ptr<const Snapshot> lookup(std::span<const int32_t> tokens);

  // Adds a snapshot (replacing an entry with the same tokens), then evicts least-recently-used entries
  // until the total is within the cap. A snapshot larger than the cap, or with no tokens, is not kept.
  void insert(std::shared_ptr<const Snapshot> s);

  void clear();
  Stats stats() const;
  size_t max_bytes() const { return max_bytes_; }

  // Bytes an entry accounts for: state + last logits + tokens.
  static size_t entry_bytes(const Snapshot& s);

 private:
  struct Entry {
    std::shared_ptr<const Snapshot> snap;
    size_t bytes;
  };
  mutable std::mutex mu_;
  size_t max_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> lru_;  // front: most recently used
  Stats stats_;
};

}  // namespace lily
