#include "text/grammar_automaton.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include "core/error.h"

namespace lily::text {

namespace {
constexpr int32_t kUnknown = -2;
constexpr int kMaxDepth = 100000;
}  // namespace

ByteAutomaton::ByteAutomaton(const Grammar& g) : sets_(g.byte_sets()) {
  g.check();
  const auto rule_min = g.min_lengths();
  rule_starts_.resize(g.rules());
  for (uint32_t r = 0; r < g.rules(); ++r)
    for (auto& a : g.alts(r)) {
      rule_starts_[r].push_back(uint32_t(nodes_.size()));
      for (auto& s : a)
        nodes_.push_back({s.kind == Grammar::Symbol::Bytes ? Node::Bytes : Node::Rule, s.index});
      nodes_.push_back({Node::End, 0});
    }
  suffix_min_.assign(nodes_.size(), 0);
  for (size_t i = nodes_.size(); i-- > 0;) {
    const Node& n = nodes_[i];
    if (n.kind == Node::End) continue;
    suffix_min_[i] = (n.kind == Node::Bytes ? 1 : rule_min[n.index]) + suffix_min_[i + 1];
  }
  Closure c;
  for (uint32_t a : rule_starts_[g.root()]) expand(a, -1, c, 0);
  intern_state(std::move(c));
}

uint32_t ByteAutomaton::intern(uint32_t pos, int32_t parent) {
  const uint64_t key = uint64_t(pos) << 32 | uint32_t(parent + 1);
  auto [it, fresh] = snode_ids_.try_emplace(key, uint32_t(snodes_.size()));
  if (fresh) {
    int32_t d = suffix_min_[pos] + (parent < 0 ? 0 : snodes_[size_t(parent)].dist);
    snodes_.push_back({pos, parent, d});
    closure_memo_.push_back(-1);
    advanced_memo_.push_back(-1);
    held_ += sizeof(SNode) + 8 + 32;  // the node, its memos, its snode_ids_ entry
  }
  return it->second;
}

void ByteAutomaton::expand(uint32_t pos, int32_t parent, Closure& out, int depth) {
  if (depth > kMaxDepth) throw InternalError("grammar expansion does not terminate");
  const Node n = nodes_[pos];
  switch (n.kind) {
    case Node::End:
      if (parent < 0) {
        out.accept = true;
      } else {
        const Closure& c = closure(uint32_t(parent));
        out.tops.insert(out.tops.end(), c.tops.begin(), c.tops.end());
        out.accept |= c.accept;
      }
      return;
    case Node::Bytes:
      out.tops.push_back(intern(pos, parent));
      return;
    case Node::Rule: {
      // A rule in tail position returns straight to the frame below (the stack does not grow).
      const int32_t ret = nodes_[pos + 1].kind == Node::End ? parent : int32_t(intern(pos + 1, parent));
      for (uint32_t a : rule_starts_[n.index]) expand(a, ret, out, depth + 1);
      return;
    }
  }
}

const ByteAutomaton::Closure& ByteAutomaton::closure(uint32_t stack) {
  if (closure_memo_[stack] < 0) {
    Closure c;
    const SNode sn = snodes_[stack];
    expand(sn.pos, sn.parent, c, 0);
    std::sort(c.tops.begin(), c.tops.end());
    c.tops.erase(std::unique(c.tops.begin(), c.tops.end()), c.tops.end());
    held_ += sizeof(Closure) + c.tops.size() * 4;
    closures_.push_back(std::move(c));
    closure_memo_[stack] = int32_t(closures_.size() - 1);
  }
  return closures_[size_t(closure_memo_[stack])];
}

const ByteAutomaton::Closure& ByteAutomaton::advanced(uint32_t stack) {
  if (advanced_memo_[stack] < 0) {
    Closure c;
    const SNode sn = snodes_[stack];
    expand(sn.pos + 1, sn.parent, c, 0);
    std::sort(c.tops.begin(), c.tops.end());
    c.tops.erase(std::unique(c.tops.begin(), c.tops.end()), c.tops.end());
    held_ += sizeof(Closure) + c.tops.size() * 4;
    closures_.push_back(std::move(c));
    advanced_memo_[stack] = int32_t(closures_.size() - 1);
  }
  return closures_[size_t(advanced_memo_[stack])];
}

ByteAutomaton::State ByteAutomaton::intern_state(Closure&& c) {
  std::sort(c.tops.begin(), c.tops.end());
  c.tops.erase(std::unique(c.tops.begin(), c.tops.end()), c.tops.end());
  std::string key(c.tops.size() * 4 + 1, '\0');
  key[0] = c.accept ? 1 : 0;
  std::copy_n(reinterpret_cast<const char*>(c.tops.data()), c.tops.size() * 4, key.data() + 1);
  auto [it, fresh] = state_ids_.try_emplace(std::move(key), State(states_.size()));
  if (fresh) {
    StateInfo s;
    s.accept = c.accept;
    s.dist = c.accept ? 0 : INT32_MAX;
    for (uint32_t t : c.tops) s.dist = std::min(s.dist, snodes_[t].dist);
    held_ += sizeof(StateInfo) + c.tops.size() * 8 + 48;  // the state and its state_ids_ key
    s.stacks = std::move(c.tops);
    states_.push_back(std::move(s));
  }
  return it->second;
}

ByteAutomaton::State ByteAutomaton::step(State s, uint8_t b) {
  int32_t ti = states_[size_t(s)].trans;
  if (ti >= 0 && trans_[size_t(ti)][b] != kUnknown) return trans_[size_t(ti)][b];
  if (ti < 0) {
    ti = int32_t(trans_.size());
    trans_.emplace_back();
    trans_.back().fill(kUnknown);
    held_ += sizeof(trans_.back());
    states_[size_t(s)].trans = ti;
  }
  Closure c;
  const std::vector<uint32_t> stacks = states_[size_t(s)].stacks;  // intern_state may move states_
  for (uint32_t t : stacks) {
    const Node& n = nodes_[snodes_[t].pos];
    if (!sets_[n.index].has(b)) continue;
    const Closure& a = advanced(t);
    c.tops.insert(c.tops.end(), a.tops.begin(), a.tops.end());
    c.accept |= a.accept;
  }
  const State next = c.tops.empty() && !c.accept ? kDead : intern_state(std::move(c));
  trans_[size_t(ti)][b] = next;
  return next;
}

size_t ByteAutomaton::memory() const {
  size_t n = held_ + nodes_.size() * sizeof(Node) + suffix_min_.size() * 4 + sets_.size() * sizeof(ByteSet);
  for (const auto& r : rule_starts_) n += r.size() * 4 + sizeof(r);
  return n;
}

int ByteAutomaton::next_byte(State s) const {
  const StateInfo& si = states_[size_t(s)];
  if (si.accept) return -1;
  int best = 256;
  for (uint32_t t : si.stacks) {
    if (snodes_[t].dist != si.dist) continue;  // only a shortest stack's byte shortens the distance
    const ByteSet& set = sets_[nodes_[snodes_[t].pos].index];
    for (int w = 0; w < 4 && w * 64 < best; ++w)
      if (set.w[size_t(w)]) {
        best = std::min(best, w * 64 + std::countr_zero(set.w[size_t(w)]));
        break;
      }
  }
  return best < 256 ? best : -1;
}

ByteAutomaton::State ByteAutomaton::walk(State s, std::string_view bytes) {
  for (char ch : bytes) {
    s = step(s, uint8_t(ch));
    if (s == kDead) return kDead;
  }
  return s;
}

}  // namespace lily::text
