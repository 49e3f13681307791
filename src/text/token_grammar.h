// A grammar applied to a tokenizer's vocabulary: which token ids may come next so that the output
// still spells a prefix of the grammar's language. Tokens are byte strings (byte-level BPE: a token may
// hold part of a string, part of a UTF-8 character, or several grammar symbols); they are decoded once
// into a trie, and a state's mask is one walk of that trie through the byte automaton, pruned at the
// first rejected byte. Masks are cached per automaton state, so after warm-up a step costs a lookup.
#pragma once
#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/grammar.h"
#include "text/grammar_automaton.h"

namespace lily::text {

class Tokenizer;

// The byte strings of every token id, in a trie laid out in preorder.
class TokenVocabulary {
 public:
  // bytes[id]: the token's text; empty: the id is never allowed by a grammar (special tokens, ids past
  // the tokenizer's vocabulary).
  explicit TokenVocabulary(std::vector<std::string> bytes);
  // Ids 0..n_ids-1 (n_ids >= the tokenizer's vocabulary, e.g. the model's); special tokens excluded.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tok, int32_t n_ids);

  int32_t size() const { return int32_t(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  size_t trie_nodes() const { return nodes_.size(); }

  struct TrieNode {
    uint8_t byte;
    uint16_t depth;  // 1 for a token's first byte
    uint32_t end;    // one past the last node of this subtree
    int32_t token;   // a token whose bytes end here, or -1
  };
  const std::vector<TrieNode>& trie() const { return nodes_; }
  // Ids with the same bytes as an earlier id: (node, id).
  const std::vector<std::pair<uint32_t, int32_t>>& duplicates() const { return dups_; }
  size_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<TrieNode> nodes_;
  std::vector<std::pair<uint32_t, int32_t>> dups_;
  size_t max_depth_ = 0;
};

struct TokenMask {
  std::vector<uint64_t> bits;  // bit (id % 64) of word id / 64
  int32_t text_tokens = 0;     // allowed ids that are not end ids
  bool end_allowed = false;    // the end ids are in `bits` (the output so far is a complete document)
  int32_t max_distance = 0;    // largest token_distance() of a state an allowed token leads to
};

class TokenGrammar {
 public:
  using State = ByteAutomaton::State;
  static constexpr State kDead = ByteAutomaton::kDead;

  // `end_ids`: the ids that end generation (im_end, eos), allowed exactly where the grammar accepts.
  // `cache_bytes` bounds the cached masks (the oldest are dropped first).
  TokenGrammar(const Grammar& g, std::shared_ptr<const TokenVocabulary> vocab, std::vector<int32_t> end_ids,
               size_t cache_bytes = size_t(64) << 20);

  State start() const { return 0; }
  // Allowed ids in state `s`. `budget`: tokens that may still be generated, this one included (< 0:
  // no limit); a token is then only allowed when the state it leads to has a token_distance() within
  // the tokens left after it. Since a state's token_distance() is reached by its first token, the
  // document is complete within the budget whenever token_distance(start) fits in it.
  std::shared_ptr<const TokenMask> mask(State s, int64_t budget = -1);
  // The state after `token`; kDead when the grammar rejects it. An end id leaves an accepting state as it is.
  State advance(State s, int32_t token);
  // Advances over raw bytes (kDead when rejected).
  State advance_bytes(State s, std::string_view bytes);
  bool accepting(State s);
  // Tokens that surely finish the document from `s`: the fewest tokens that spell the automaton's
  // shortest completion (ByteAutomaton::next_byte), at most its length in bytes when every byte is a
  // token; kUnreachable when no tokens spell it. An upper bound on the true fewest, and consistent: the
  // first of those tokens leads to a state whose token_distance() is one less.
  int32_t token_distance(State s);
  static constexpr int32_t kUnreachable = INT32_MAX / 4;
  bool is_end(int32_t token) const;
  bool has_end_ids() const { return !end_ids_.empty(); }

  const TokenVocabulary& vocab() const { return *vocab_; }
  struct Stats {
    size_t states = 0, masks = 0, mask_bytes = 0;
    size_t bytes = 0;  // all it holds: cached masks, the automaton built so far, per-state tables
    uint64_t hits = 0, misses = 0;
  };
  Stats stats();

 private:
  static constexpr int32_t kNoLimit = INT32_MAX;
  std::shared_ptr<TokenMask> compute(State s, int32_t max_dist);
  int32_t bound(State s);  // token_distance() with mu_ held
  uint32_t child(uint32_t node, uint8_t byte) const;  // trie child, or kNoNode
  static constexpr uint32_t kNoNode = UINT32_MAX;

  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<int32_t> end_ids_;
  size_t cache_bytes_;
  std::mutex mu_;
  ByteAutomaton dfa_;
  std::vector<State> walk_;  // scratch: automaton state per trie depth
  std::array<uint32_t, 256> roots_;  // the trie's first-byte nodes (kNoNode: no token starts so)
  std::vector<int32_t> bounds_;      // token_distance() per automaton state, -1 until computed
  std::vector<State> path_;          // scratch of bound(): the states of a shortest completion
  std::string path_bytes_;           //   and its bytes
  std::vector<int32_t> path_bounds_;
  // key: state << 32 | budget threshold (the largest bound a token may lead to; kNoLimit: none)
  std::unordered_map<uint64_t, std::shared_ptr<const TokenMask>> cache_;
  std::vector<uint64_t> order_;  // insertion order of cache_ keys
  size_t order_head_ = 0;
  size_t cached_bytes_ = 0;
  Stats stats_;
};

}  // namespace lily::text
