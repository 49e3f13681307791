// A grammar run as a lazily built deterministic automaton over bytes. A parse position is a stack of
// grammar positions (the top is the byte set to match next, the rest are where finished rules return
// to); stacks are hash-consed so a stack is one id, and an automaton state is the set of stacks the
// bytes so far allow (ambiguous grammars keep several). Transitions are computed on first use and kept,
// so a byte step after warm-up is one table lookup. Not thread-safe (TokenGrammar locks around it).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/grammar.h"

namespace lily::text {

class ByteAutomaton {
 public:
  using State = int32_t;
  static constexpr State kDead = -1;

  // Checks the grammar (InternalError when it is malformed).
  explicit ByteAutomaton(const Grammar& g);

  State start() const { return 0; }
  State step(State s, uint8_t b);
  State walk(State s, std::string_view bytes);  // kDead when some byte is rejected
  bool accepting(State s) const { return states_[size_t(s)].accept; }
  bool can_continue(State s) const { return !states_[size_t(s)].stacks.empty(); }
  // Fewest bytes that take `s` to an accepting state (0 when accepting).
  int32_t distance(State s) const { return states_[size_t(s)].dist; }
  // The lowest byte that starts a shortest completion of `s` (the state after it is one byte closer to
  // accepting); -1 when `s` accepts (or cannot finish). Following it spells one fixed shortest completion.
  int next_byte(State s) const;
  size_t states() const { return states_.size(); }
  size_t stacks() const { return snodes_.size(); }
  size_t memory() const;  // bytes held by the states, stacks and transitions built so far (an estimate)

 private:
  struct Node {
    enum Kind : uint8_t { Bytes, Rule, End } kind;
    uint32_t index;
  };
  struct SNode {
    uint32_t pos;
    int32_t parent;  // -1: bottom
    int32_t dist;    // fewest bytes to empty this stack
  };
  struct Closure {
    std::vector<uint32_t> tops;  // stacks whose top is a byte set
    bool accept = false;
  };
  struct StateInfo {
    std::vector<uint32_t> stacks;
    bool accept = false;
    int32_t dist = 0;
    int32_t trans = -1;  // index into trans_, -1 until the first step
  };

  uint32_t intern(uint32_t pos, int32_t parent);
  void expand(uint32_t pos, int32_t parent, Closure& out, int depth);
  const Closure& closure(uint32_t stack);   // of the stack as it is
  const Closure& advanced(uint32_t stack);  // after its top byte set matched
  State intern_state(Closure&& c);

  std::vector<Node> nodes_;
  std::vector<int32_t> suffix_min_;
  std::vector<std::vector<uint32_t>> rule_starts_;
  std::vector<ByteSet> sets_;
  std::vector<SNode> snodes_;
  std::unordered_map<uint64_t, uint32_t> snode_ids_;
  std::vector<int32_t> closure_memo_, advanced_memo_;
  std::vector<Closure> closures_;
  std::vector<StateInfo> states_;
  std::unordered_map<std::string, State> state_ids_;
  std::vector<std::array<int32_t, 256>> trans_;
  size_t held_ = 0;  // bytes of the stacks, closures, states and transitions built so far
};

}  // namespace lily::text
